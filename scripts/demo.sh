#!/usr/bin/env bash
# Install the dependencies, build, start attnd on config/attnd.json (CPU backend, listening on
# ipc:///tmp/attnd.sock), replay a prefill and a decode step through attnctl from .npy files and
# check them against numpy, run a short bench and the Python example, then stop the daemon with
# SIGTERM. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target attnd attnctl attnd-client

py=""
for p in python3 /usr/bin/python3; do
  if "$p" -c "import numpy" 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "demo: no python3 with numpy (scripts/setup.sh installs python3-numpy)"; exit 1; }

config=config/attnd.json
url=$("$py" -c "import json; print(json.load(open('$config'))['server']['listen'])")
attnctl=("$build/client/attnctl" -u "$url")
work=$(mktemp -d)
log="$work/attnd.log"

echo "== starting attnd on $config ($url), log in $log"
"$build/daemon/attnd" --config "$config" >"$log" 2>&1 &
pid=$!
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait "$pid" || { echo "demo: attnd exited with status $?"; tail -20 "$log"; exit 1; }
  fi
}
trap stop EXIT
for _ in $(seq 100); do
  "${attnctl[@]}" status >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { echo "demo: attnd did not start"; cat "$log"; exit 1; }
  sleep 0.1
done

echo "== attnctl status"
"${attnctl[@]}" status

echo "== Q/K/V for a 6-token prefill and one decode step ($work/*.npy)"
"$py" - "$config" "$work" <<'EOF'
import json, sys
import numpy as np
g = json.load(open(sys.argv[1]))["geometry"]
rng = np.random.default_rng(7)
for name, t in (("prefill", 6), ("decode", 1)):
    for x, heads in (("q", g["num_q_heads"]), ("k", g["num_kv_heads"]), ("v", g["num_kv_heads"])):
        a = rng.standard_normal((t, heads, g["head_size"]), dtype=np.float32)
        np.save(f"{sys.argv[2]}/{name}_{x}.npy", a)
EOF

echo "== attnctl: create a sequence, prefill it, decode one token, list, free (one session)"
w=$work
"${attnctl[@]}" create 1 \
  + attend "$w/prefill_q.npy" "$w/prefill_k.npy" "$w/prefill_v.npy" "$w/prefill_out.npy" --seqs 1:6 \
  + attend "$w/decode_q.npy" "$w/decode_k.npy" "$w/decode_v.npy" "$w/decode_out.npy" --seqs 1:1 \
  + seqs + free 1

echo "== the daemon's outputs against numpy attention"
"$py" - "$config" "$work" <<'EOF'
import json, sys
import numpy as np
g, w = json.load(open(sys.argv[1]))["geometry"], sys.argv[2]
def bf16(x):  # the bf16 cache's rounding
    u = x.astype(np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
ld = lambda n: np.load(f"{w}/{n}.npy")
q = np.concatenate([ld("prefill_q"), ld("decode_q")])
k = np.concatenate([ld("prefill_k"), ld("decode_k")])
v = np.concatenate([ld("prefill_v"), ld("decode_v")])
if g["cache_dtype"] == "bf16":
    k, v = bf16(k), bf16(v)
out = np.concatenate([ld("prefill_out"), ld("decode_out")])
scale = g["scale"] or 1 / np.sqrt(g["head_size"])
group = g["num_q_heads"] // g["num_kv_heads"]
ref = np.zeros(out.shape)
for t in range(len(q)):
    for h in range(g["num_q_heads"]):
        s = k[: t + 1, h // group] @ q[t, h] * scale
        p = np.exp(s - s.max())
        ref[t, h] = p / p.sum() @ v[: t + 1, h // group]
err = np.abs(out - ref).max()
print(f"decode token, head 0: {np.round(out[-1, 0, :6], 4)}")
print(f"max |attnd - numpy| over {out.size} values: {err:.2e}")
sys.exit(0 if err < 1e-3 else 1)
EOF

echo "== attnctl bench (decode steps of 4 sequences x 1 token, context 256, both layers)"
"${attnctl[@]}" bench --steps 300 --warmup 20

echo "== Python binding: client/python/example.py"
"$py" client/python/example.py --url "$url" --lib "$build/client/libattnd-client.so"

echo "== stopping attnd (SIGTERM drains, then exits 0)"
trap - EXIT
stop
tail -3 "$log"
rm -rf "$work"
echo "demo: ok"
