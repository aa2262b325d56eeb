#!/usr/bin/env bash
# Starts the local control plane on 127.0.0.1: etcd, kube-apiserver (RBAC on), the
# controller-manager, the scheduler and kwok with one fake node. Builds the binaries first if
# the cache lacks them. Writes admin.kubeconfig and linnet.kubeconfig into the run directory,
# and returns once the API is ready, the node is Ready and the default ServiceAccount exists.
#
#   tests/cluster/up.sh           start (does nothing if this control plane already runs)
#   tests/cluster/down.sh         stop and remove all run files
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

api="https://127.0.0.1:$CP_API_PORT"

log() { echo "cluster: $*" >&2; }
die() {
  log "$*"
  for f in "$CP_RUN"/logs/*.log; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

if cp_running; then
  log "already running; admin kubeconfig: $CP_RUN/admin.kubeconfig"
  exit 0
fi

bin=$("$here/build.sh" | tail -n 1)
"$here/down.sh" >/dev/null 2>&1 || true
mkdir -p "$CP_RUN"/{pki,logs,pid,etcd,pv}
cd "$CP_RUN"

# --- certificates and tokens ---------------------------------------------------------------
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=linnet-test-ca" \
  -keyout pki/ca.key -out pki/ca.crt \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout pki/apiserver.key -out pki/apiserver.csr
cat >pki/apiserver.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
EOF
openssl_quiet x509 -req -in pki/apiserver.csr -CA pki/ca.crt -CAkey pki/ca.key -CAcreateserial \
  -days 30 -extfile pki/apiserver.ext -out pki/apiserver.crt
openssl_quiet genrsa -out pki/sa.key 2048
openssl_quiet rsa -in pki/sa.key -pubout -out pki/sa.pub

admin_token=$(openssl rand -hex 24)
linnet_token=$(openssl rand -hex 24)
echo "$admin_token" >admin.token
echo "$linnet_token" >linnet.token
# token,user,uid,"groups": the admin is in system:masters; linnet has only what RBAC grants it.
cat >pki/tokens.csv <<EOF
$admin_token,admin,admin,"system:masters"
$linnet_token,linnet,linnet
EOF
chmod 600 pki/*.key pki/tokens.csv admin.token linnet.token

write_kubeconfig() { # file user token
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: linnet-local
  cluster:
    server: $api
    certificate-authority: $CP_RUN/pki/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@linnet-local
  context:
    cluster: linnet-local
    user: $2
    namespace: default
current-context: $2@linnet-local
EOF
}
write_kubeconfig admin.kubeconfig admin "$admin_token"
write_kubeconfig linnet.kubeconfig linnet "$linnet_token"

# --- processes ----------------------------------------------------------------------------
start() { # name args...
  local name=$1; shift
  "$bin/$name" "$@" >"logs/$name.log" 2>&1 &
  echo $! >"pid/$name.pid"
}

wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what"
    sleep 0.3
  done
}

log "starting etcd"
start etcd --name linnet-test --data-dir "$CP_RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$CP_ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$CP_ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$CP_ETCD_PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$CP_ETCD_PEER_PORT" \
  --initial-cluster "linnet-test=http://127.0.0.1:$CP_ETCD_PEER_PORT" \
  --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
wait_for etcd 30 curl -fsS "http://127.0.0.1:$CP_ETCD_PORT/health"

# An audit log of linnet's requests only (user `linnet` and the shipped ServiceAccount), so
# `make bench` can count exactly what the agent wrote (e.g. none while idle) and read.
cat >audit-policy.yaml <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["linnet", "system:serviceaccount:linnet-system:linnet"]
  verbs: ["create", "update", "patch", "delete", "deletecollection", "get", "list", "watch"]
- level: None
EOF

log "starting kube-apiserver"
start kube-apiserver \
  --audit-policy-file audit-policy.yaml --audit-log-path logs/audit.log \
  --audit-log-maxsize 200 --audit-log-maxbackup 1 \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$CP_API_PORT" \
  --etcd-servers "http://127.0.0.1:$CP_ETCD_PORT" \
  --tls-cert-file pki/apiserver.crt --tls-private-key-file pki/apiserver.key \
  --client-ca-file pki/ca.crt \
  --authorization-mode RBAC --token-auth-file pki/tokens.csv \
  --service-account-key-file pki/sa.pub --service-account-signing-key-file pki/sa.key \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range 10.96.0.0/16 \
  --endpoint-reconciler-type none \
  --allow-privileged --profiling=false
auth=(-H "Authorization: Bearer $admin_token")
curl_api() { curl -fsS --max-time 10 --cacert pki/ca.crt "${auth[@]}" "$@"; }
wait_for kube-apiserver 120 curl_api "$api/readyz"

log "starting kube-controller-manager and kube-scheduler"
# Client rate limits well above the defaults (20 and 50 QPS), so that `make bench` at 1,000
# rollouts measures linnet rather than the controller-manager's client throttle.
start kube-controller-manager --kubeconfig admin.kubeconfig --leader-elect=false \
  --kube-api-qps 300 --kube-api-burst 600 \
  --controllers '*' --secure-port 0 \
  --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
  --cluster-signing-cert-file pki/ca.crt --cluster-signing-key-file pki/ca.key
start kube-scheduler --kubeconfig admin.kubeconfig --leader-elect=false --secure-port 0 \
  --kube-api-qps 300 --kube-api-burst 600

# kwok: the stock node and pod stages, except that pods whose image tag is `broken` run but
# never become Ready, and Job pods whose image tag is `fail` fail (tests use these to reach
# rollback and migration-failure paths); and a running pod made NotReady by another actor
# becomes Ready again, as under a kubelet (kwok-stage-ready-again.yaml).
stages=$bin/kwok-stages
{
  cat "$stages/node-initialize.yaml"; echo "---"
  cat "$stages/node-heartbeat-with-lease.yaml"; echo "---"
  # pod-ready, narrowed to pods with no `broken` image.
  sed "s|^    matchExpressions:|    matchExpressions:\n    - key: '[.spec.containers[].image \| endswith(\":broken\")] \| any'\n      operator: 'NotIn'\n      values: ['true']|" \
    "$stages/pod-ready.yaml"; echo "---"
  cat "$here/kwok-stage-broken.yaml"; echo "---"
  cat "$here/kwok-stage-ready-again.yaml"; echo "---"
  # pod-complete, narrowed to Job pods with no `fail` image; those fail instead.
  sed "s|^    matchExpressions:|    matchExpressions:\n    - key: '[.spec.containers[].image \| endswith(\":fail\")] \| any'\n      operator: 'NotIn'\n      values: ['true']|" \
    "$stages/pod-complete.yaml"; echo "---"
  cat "$here/kwok-stage-fail.yaml"; echo "---"
  cat "$stages/pod-delete.yaml"
} >kwok.yaml
grep -q 'endswith(":broken")' kwok.yaml || die "could not narrow kwok's pod-ready stage"
[ "$(grep -c 'endswith(":fail")' kwok.yaml)" = 2 ] || die "could not narrow kwok's pod-complete stage"

log "starting kwok"
start kwok --kubeconfig admin.kubeconfig --config kwok.yaml \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --node-ip 198.18.0.1 --cidr 198.18.0.0/16 --node-lease-duration-seconds 40 \
  --server-address 127.0.0.1:0

# --- objects ------------------------------------------------------------------------------
post() { # path json
  curl_api -X POST -H 'Content-Type: application/json' "$api$1" -d "$2" >/dev/null
}
post /api/v1/nodes '{"apiVersion":"v1","kind":"Node","metadata":{"name":"kwok-node-0",
  "annotations":{"kwok.x-k8s.io/node":"fake","node.alpha.kubernetes.io/ttl":"0"},
  "labels":{"kubernetes.io/hostname":"kwok-node-0","kubernetes.io/os":"linux","type":"kwok"}},
  "spec":{}}'
post /apis/storage.k8s.io/v1/storageclasses '{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass",
  "metadata":{"name":"local-static","annotations":{"storageclass.kubernetes.io/is-default-class":"true"}},
  "provisioner":"kubernetes.io/no-provisioner","volumeBindingMode":"Immediate","reclaimPolicy":"Retain"}'
pv_count=${CP_PV_COUNT:-200}
log "creating $pv_count static PersistentVolumes"
pv_jobs=()
wait_pvs() {
  for p in "${pv_jobs[@]}"; do wait "$p" || die "creating a PersistentVolume failed"; done
  pv_jobs=()
}
for i in $(seq -w 1 "$pv_count"); do
  post /api/v1/persistentvolumes "{\"apiVersion\":\"v1\",\"kind\":\"PersistentVolume\",
    \"metadata\":{\"name\":\"pv-$i\",\"labels\":{\"linnet.dev/pool\":\"static\"}},
    \"spec\":{\"capacity\":{\"storage\":\"10Gi\"},\"accessModes\":[\"ReadWriteOnce\"],
    \"persistentVolumeReclaimPolicy\":\"Retain\",\"storageClassName\":\"local-static\",
    \"hostPath\":{\"path\":\"$CP_RUN/pv/pv-$i\"}}}" &
  pv_jobs+=($!)
  # a few at a time keeps it quick without flooding the API server (plain `wait` would also
  # wait for the control plane's own processes)
  if [ ${#pv_jobs[@]} -ge 8 ]; then wait_pvs; fi
done
wait_pvs

node_ready() {
  curl_api "$api/api/v1/nodes/kwok-node-0" | python3 -c '
import json, sys
n = json.load(sys.stdin)
ok = any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
sys.exit(0 if ok else 1)'
}
wait_for "node kwok-node-0 to be Ready" 60 node_ready
wait_for "the default ServiceAccount" 60 curl_api "$api/api/v1/namespaces/default/serviceaccounts/default"

touch ready
log "ready ($(cat "$bin/../VERSION" 2>/dev/null || echo "$K8S_VERSION")) in $CP_RUN"
log "  export KUBECONFIG=$CP_RUN/admin.kubeconfig      # admin"
log "  linnet's non-admin identity:  $CP_RUN/linnet.kubeconfig"
