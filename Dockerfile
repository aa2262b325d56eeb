# linnet's image: a static-ish release build on Debian, copied into distroless (glibc, CA
# certificates, user 65532), with the kustomize and helm it renders with, as `make image`
# ships them. Build from the repository root:
#
#   docker build -t ghcr.io/linnet-dev/linnet:0.1.0 .
#
# The binary is the one `make test` tests (`cargo build --release --locked`). libgit2 and
# libssh2 are compiled in, with zlib-ng (built with cmake); rustls (with ring) is compiled
# in for the Kubernetes API and commit statuses. Git over HTTPS goes through the system's
# OpenSSL: the binary links libssl.so.3 and libcrypto.so.3, which distroless/cc-debian12
# ships, with the CA bundle at /etc/ssl/certs that both TLS stacks trust. A private CA is added with --ca-file.
FROM rust:1.95-bookworm AS build
WORKDIR /src
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake pkg-config \
    && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
# The commit goes into linnet_build_info: docker build --build-arg LINNET_GIT_COMMIT=$(git rev-parse HEAD) .
ARG LINNET_GIT_COMMIT=unknown
RUN LINNET_GIT_COMMIT=$LINNET_GIT_COMMIT cargo build --release --locked --bin linnet \
    && strip target/release/linnet

# The renderers the agent runs on Kustomize overlays and Helm charts, built from the same
# pinned Go modules as `make image` (deploy/render-tools/build.sh), static, into
# /usr/local/bin as in that image.
FROM golang:1.26-bookworm AS render-tools
WORKDIR /src/deploy/render-tools
COPY deploy/render-tools ./
RUN bin=$(LINNET_CACHE=/tmp/linnet-cache ./build.sh) \
    && cp "$bin/kustomize" "$bin/helm" /usr/local/bin/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/linnet /usr/local/bin/linnet
COPY --from=render-tools /usr/local/bin/kustomize /usr/local/bin/helm /usr/local/bin/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/linnet"]
CMD ["agent"]
