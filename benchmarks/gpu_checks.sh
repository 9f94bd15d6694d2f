#!/usr/bin/env bash
# The GPU checks still owed by the low-rank work, as one prepared command for a session that is lent a GPU machine
# (the `device` tool: its `run` copies this checkout there; 15 minutes of device time a session, start included).
#
# That machine's image has Python 3.12 with jax (CUDA), flax, optax, chex, numpy, msgpack, tqdm, six and pytest,
# but not gymnax, gymnasium, tensorboardX, pyzmq or cma: they travel as wheels in `.whl/` (git-ignored through
# .git/info/exclude). Here, once, from the repository's root:
#
#   echo /.whl/ >> .git/info/exclude
#   for p in gymnax==1.0.1 gymnasium==1.3.0 farama-notifications==0.0.4 tensorboardX==2.6.5 pyzmq==27.3.0 cma==4.5.0; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 -d .whl "$p"
#   done
#
# then the device tool's `run` with carry [".whl"], timeout_s 600 and the command
#
#   bash benchmarks/gpu_checks.sh
#
# Each part has its own time limit, so the whole ends in about 9 minutes at most and one part's failure does not stop
# the others; everything is printed (the tool returns the output's last 12,000 characters) and kept under $OUT.
# In order of what the issue still needs: (1) the MinAtar CNN rows at the Conv correction's current form (the
# README's GPU rows are the form before b0e3263), (2) where a low-rank MLP 256x256 generation's time goes on the GPU
# (a split and the profiler's top kernels per part), (3) tests/test_bounds.py's bit tests (the same bits over
# devices) on a GPU. Set GPU_CHECKS=cnn,profile (any of cnn, profile, bounds) to run some of them.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
CHECKS=${GPU_CHECKS:-cnn,profile,bounds}
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_checks: installing .whl/ failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
python3 -c "import jax, flax, gymnax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" 2>&1 \
    | tee -a "$OUT/device.txt"
git log -1 --format='commit %H %cd' 2>/dev/null | tee -a "$OUT/device.txt"
status=0

part() {  # part NAME SECONDS COMMAND...: run one check under its limit, output to the screen and $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    case ",$CHECKS," in *",$name,"*) ;; *) return 0 ;; esac
    echo "=== $name ($(date -u +%H:%M:%S) UTC, limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | grep -v -E "^(W|I)[0-9]{4} " | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    [ "$rc" = 0 ] || status=1
}

part cnn 240 python3 benchmarks/inference_ratio.py --seeds 0,1,2,3,4 --repeats 3 --limit 1e10 --envs minatar \
    --hidden 256,1024 --members 512 --ranks 1,4 --full-rank-limit 6e8
part profile 150 python3 benchmarks/inference_ratio.py --breakdown --profile /tmp/gpu_traces --envs pendulum \
    --hidden 256 --members 512 --ranks 1 --seeds 0,1,2,3,4 --repeats 3 --limit 1e10
part bounds 120 python3 -m pytest -q -p no:cacheprovider tests/test_bounds.py
exit $status
