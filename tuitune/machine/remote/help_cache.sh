# The engine's flag listing, cached on the target; sent as `sh -c` (never a file there).
# $1 python, $2 help_key.py's text, $3 module, $4 the environment's hash, then the listing's
# arguments. A listing found under its key is printed as it is; otherwise the engine lists its
# flags, and a successful listing is written to a temporary file and renamed into place (two
# launches at once never read half of one). Where the cache cannot be written, the engine is asked.
py=$1; keypy=$2; mod=$3; envh=$4; shift 4
key=$("$py" -c "$keypy" "$mod" "$envh" "$@" 2>/dev/null)
d="$HOME/.cache/tuitune/flags"
case $key in *[!0-9a-f]*|"") key= ;; esac
if [ -n "$key" ] && [ -s "$d/$key" ]; then echo "tuitune: flags cached" >&2; exec cat -- "$d/$key"; fi
if [ -n "$key" ] && mkdir -p -- "$d" 2>/dev/null && t=$(mktemp "$d/.tmp.XXXXXX" 2>/dev/null); then
  "$py" -m "$mod" "$@" >"$t"; rc=$?
  cat -- "$t"
  if [ "$rc" -eq 0 ]; then mv -f -- "$t" "$d/$key" 2>/dev/null || rm -f -- "$t"; else rm -f -- "$t"; fi
  exit "$rc"
fi
exec "$py" -m "$mod" "$@"
