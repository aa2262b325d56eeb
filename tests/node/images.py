#!/usr/bin/env python3
"""The real-node tests' images, built with linnet's own OCI builder (deploy/image/build.py),
as archives `ctr images import` loads into the node's containerd: no Docker, no registry.

    images.py BIN_DIR OUT_DIR

BIN_DIR holds the static `pause` and `kvserver` that tests/node/build.sh compiled. OUT_DIR gets
one archive per image:
- registry.k8s.io/pause:3.10.1, the pod sandbox (the name the node's containerd asks for);
- linnet.test/kv:v1, v2, v3: the key-value server answering its version on /version;
- linnet.test/kv:broken: the same server, never ready (its readiness probe fails), for the
  rollback paths;
- linnet.test/kv:bad: ready, but every request to / fails (500), for analysis on a gateway's
  metrics.
Pods use them with `imagePullPolicy: Never`.
"""

import gzip
import importlib.util
import io
import os
import shutil
import sys
import tarfile

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "oci_build", os.path.join(here, "..", "..", "deploy", "image", "build.py"))
oci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oci)

PAUSE = "registry.k8s.io/pause:3.10.1"
KV = "linnet.test/kv"
KV_TAGS = ["v1", "v2", "v3", "broken", "bad"]


def one_binary_layer(src, dest):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ["data", "tmp", "usr", "usr/local", "usr/local/bin"]:
            oci.entry(tar, d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        with open(src, "rb") as f:
            oci.entry(tar, dest, f.read(), mode=0o755)
    return out.getvalue()


def build(out_dir, name, layer_tar, entrypoint, env, user):
    work = os.path.join(out_dir, "layout")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "blobs", "sha256"))
    config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": user, "Entrypoint": entrypoint, "Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers",
                   "diff_ids": ["sha256:" + oci.hashlib.sha256(layer_tar).hexdigest()]},
    }
    compressed = gzip.compress(layer_tar, compresslevel=6, mtime=0)
    tag = name.rsplit(":", 1)[1]
    oci.write_layout(work, compressed, config, {"org.opencontainers.image.title": name}, tag, name)
    archive = os.path.join(out_dir, name.replace("/", "_").replace(":", "_") + ".tar")
    oci.archive(work, archive)
    shutil.rmtree(work)
    return archive


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    bin_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    pause = one_binary_layer(os.path.join(bin_dir, "pause"), "pause")
    build(out_dir, PAUSE, pause, ["/pause"], [], "65535:65535")
    kv = one_binary_layer(os.path.join(bin_dir, "kvserver"), "usr/local/bin/kvserver")
    for tag in KV_TAGS:
        env = ["PATH=/usr/local/bin", f"KV_VERSION={tag}", f"KV_IMAGE={KV}:{tag}"]
        if tag == "broken":
            env.append("KV_NEVER_READY=1")
        if tag == "bad":
            env.append("KV_FAIL_REQUESTS=1")
        # root: the volume is a host directory the runtime made, owned by root.
        build(out_dir, f"{KV}:{tag}", kv, ["/usr/local/bin/kvserver"], env, "0:0")
    print(out_dir)


if __name__ == "__main__":
    main()
