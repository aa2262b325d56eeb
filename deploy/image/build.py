#!/usr/bin/env python3
"""Builds linnet's container image as an OCI image layout, without Docker.

One layer on nothing (no base image): the static `linnet` binary, the CA bundle of the machine
that builds it, and /etc/passwd and /etc/group naming user 65532 (nonroot), as distroless
images do. The config runs `linnet agent` as 65532:65532 and carries the OCI labels of the
version and the commit. Every timestamp is 0, so the same binary gives the same digest.

    build.py BINARY OUT_DIR --version 0.1.0 --commit $(git rev-parse HEAD) [--tag 0.1.0]

`crane push OUT_DIR REGISTRY/linnet:TAG` (what `make image-push` runs) pushes it.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
USER = 65532


def entry(tar, name, data=None, mode=0o644, kind=tarfile.REGTYPE, uid=0, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid = info.gid = uid
    info.uname = info.gname = "root" if uid == 0 else "nonroot"
    info.mtime = 0
    info.linkname = link
    if data is None:
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def layer(binary, tools):
    """The layer as an uncompressed tar, entries in a fixed order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ["etc", "etc/ssl", "etc/ssl/certs", "home", "tmp", "usr", "usr/local",
                  "usr/local/bin"]:
            entry(tar, d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        entry(tar, "home/nonroot", kind=tarfile.DIRTYPE, mode=0o700, uid=USER)
        entry(tar, "etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\n"
              b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
        entry(tar, "etc/group", b"root:x:0:\nnonroot:x:65532:\n")
        with open(CA_BUNDLE, "rb") as f:
            entry(tar, "etc/ssl/certs/ca-certificates.crt", f.read())
        with open(binary, "rb") as f:
            entry(tar, "usr/local/bin/linnet", f.read(), mode=0o755)
        for tool in sorted(tools, key=os.path.basename):
            with open(tool, "rb") as f:
                entry(tar, "usr/local/bin/" + os.path.basename(tool), f.read(), mode=0o755)
    return out.getvalue()


def blob(out_dir, data):
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(out_dir, "blobs", "sha256", digest)
    with open(path, "wb") as f:
        f.write(data)
    return "sha256:" + digest


def write_layout(out_dir, compressed_layer, config, annotations, ref_name, image_name=None):
    """Writes the config, the manifest and index.json of a one-layer image into `out_dir`
    (whose blobs/sha256 holds the layer already); returns the manifest's digest. With
    `image_name` (e.g. `linnet.test/kv:v1`), containerd's `ctr images import` names the image
    so."""
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(out_dir, config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": blob(out_dir, compressed_layer), "size": len(compressed_layer)}],
        "annotations": annotations,
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    ref = {"org.opencontainers.image.ref.name": ref_name}
    if image_name:
        ref["io.containerd.image.name"] = image_name
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": blob(out_dir, manifest_bytes),
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": ref,
        }],
    }
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True, separators=(",", ":"))
    with open(os.path.join(out_dir, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    return index["manifests"][0]["digest"]


def archive(out_dir, tar_path):
    """The layout in `out_dir` as one tar, the form `ctr images import` reads."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(out_dir):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                info = tar.gettarinfo(path, os.path.relpath(path, out_dir))
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("binary")
    p.add_argument("out_dir")
    p.add_argument("--version", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--tag", help="the tag the layout names (default: the version)")
    p.add_argument("--tool", action="append", default=[],
                   help="a static binary the agent runs (kustomize, helm), put beside it")
    p.add_argument("--image-name", help="the name `ctr images import` gives the image, "
                   "e.g. ghcr.io/linnet-dev/linnet:0.1.0 (the real-node tests load it so)")
    p.add_argument("--archive", help="also write the layout as one tar here (ctr images import)")
    a = p.parse_args()
    with open(a.binary, "rb") as f:
        if f.read(4) != b"\x7fELF":
            sys.exit(f"{a.binary} is not a Linux binary")
    if not os.path.exists(CA_BUNDLE):
        sys.exit(f"{CA_BUNDLE} is missing: install Debian's ca-certificates")

    shutil.rmtree(a.out_dir, ignore_errors=True)
    os.makedirs(os.path.join(a.out_dir, "blobs", "sha256"))
    tar = layer(a.binary, a.tool)
    compressed = gzip.compress(tar, compresslevel=6, mtime=0)
    labels = {
        "org.opencontainers.image.title": "linnet",
        "org.opencontainers.image.description": "GitOps rollout agent for Kubernetes",
        "org.opencontainers.image.version": a.version,
        "org.opencontainers.image.revision": a.commit,
        "org.opencontainers.image.source": "https://github.com/linnet-dev/linnet",
    }
    config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{USER}:{USER}",
            "Entrypoint": ["/usr/local/bin/linnet"],
            "Cmd": ["agent"],
            "Env": [
                "PATH=/usr/local/bin",
                f"SSL_CERT_FILE={CA_BUNDLE}",
            ],
            "WorkingDir": "/home/nonroot",
            "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}, "9090/tcp": {}},
            "Labels": labels,
        },
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": f"deploy/image/build.py (linnet {a.version}, {a.commit})"}],
    }
    manifest_digest = write_layout(a.out_dir, compressed, config, labels, a.tag or a.version,
                                   a.image_name)
    if a.archive:
        archive(a.out_dir, a.archive)
    print(f"{a.out_dir}: linnet {a.version} ({a.commit[:12]}), "
          f"{len(compressed) / 1e6:.1f} MB compressed, manifest {manifest_digest}")


if __name__ == "__main__":
    main()
