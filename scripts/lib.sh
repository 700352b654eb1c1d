# Shared by scripts/run and scripts/test: a virtualenv that is reinstalled only when pyproject.toml changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RIGDASH_VENV:-$ROOT/.venv}"

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
