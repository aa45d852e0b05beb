#!/usr/bin/env bash
# test_train_recipe.sh LUAPIPE — the training recipe on several ranks:
# global gradient-norm clipping (every parameter counted once: DualPipe's
# two copies, dense layers over the EP group, expert replicas under EPLB)
# and a learning-rate schedule (warmup, cosine decay) give the
# single-process reference's norms, rates, losses and parameters within
# 1e-5 (train_equivalence.lua's "+recipe" modes), for pipelines of every
# shape; then the mistakes: a clip <= 0 and a schedule function that
# returns a non-number, one line each, exit 2, nothing started.
. "$(dirname "$0")/lib.sh"
mpirun=(timeout 90 mpirun --oversubscribe)
driver=tests/mpi/train_equivalence.lua

while read -r np fam M mode what; do
  "${mpirun[@]}" -np "$np" "$luapipe" "$driver" "$fam" "$M" "$mode+recipe" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  echo "$fam $what M=$M ($mode, clip + lr schedule): rc $rc"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ': ok ' "$tmp/out")" -ne "$np" ]; then
    fail "$fam $what ($mode+recipe)"
    cat "$tmp/out" "$tmp/err"
  fi
done <<'LIST'
2 1f1b 4 mlp P=2
2 dualpipe 4 mlp P=2-two-copies-per-stage
4 dualpipev 8 mlp P=4
2 zbv 4 lm P=2-transformer-LM
4 dualpipe 4 moe_eplb_ep2 EPLB-pp=2xep=2
4 dualpipev 4 moe_ep2 MoE-pp=2xep=2
4 1f1b 8 moe MoE-pp=4xep=1
LIST

cat >"$tmp/bad.lua" <<'LUA'
local nn = require("luapipe.nn")
local train = require("luapipe.train")
local what = arg[1]
local model = nn.sequential { nn.linear(4, 4), nn.linear(4, 2), loss = "mse" }
local function data() return nn.tensor({ 2, 4 }), nn.tensor({ 2, 2 }) end
local o = { model = model, schedule = "1f1b", microbatches = 2, data = data, steps = 2, quiet = true }
if what == "clip" then o.clip = -1 else o.lr_schedule = function(k) return "fast" end end
train(o)
print("trained")
LUA
"${mpirun[@]}" -np 2 "$luapipe" "$tmp/bad.lua" clip >"$tmp/out" 2>&1
rc=$?
n=$(grep -c "^luapipe: luapipe.train: 'clip' must be a positive number (the largest gradient norm), got -1$" "$tmp/out")
echo "clip -1: rc $rc, reported $n time(s)"
{ [ "$rc" -eq 2 ] && [ "$n" -eq 1 ] && ! grep -q trained "$tmp/out"; } || { fail "clip -1"; cat "$tmp/out"; }

"${mpirun[@]}" -np 2 "$luapipe" "$tmp/bad.lua" lr >"$tmp/out" 2>&1
rc=$?
n=$(grep -c 'lr_schedule(1) returned "fast": a learning rate is a finite number >= 0' "$tmp/out")
echo "lr_schedule returning a string: rc $rc, reported $n time(s)"
{ [ "$rc" -ne 0 ] && [ "$n" -ge 1 ] && ! grep -q trained "$tmp/out"; } || { fail "lr_schedule"; cat "$tmp/out"; }

if [ "$fails" -ne 0 ]; then
  echo "test_train_recipe: $fails failure(s)"
  exit 1
fi
echo "test_train_recipe: all passed"
