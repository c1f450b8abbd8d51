# Stop a server's process group: TERM, wait, KILL, wait for the port to be free, clear the state.
# Sent inline after `set -- GROUP PORT STEPS STATE` (the lines of this header are not sent):
# $1 the group (the server's pid), $2 its port, $3 the grace period in steps of 0.1 s, $4 the
# state file to remove once stopped ("": none). A group is alive while any of its members is, and
# so are descendants that left the group (an engine's workers may), listed first, while their
# parents still hold them. Exit 0 stopped, 10 killed, 3 survived, 4 port busy.
g=$1; port=$2; steps=$3; state=$4
tree() { for c in $(pgrep -P $1 2>/dev/null); do echo $c; tree $c; done; }
t=$(tree $g)
alive() { for p in $(pgrep -g $g 2>/dev/null) $g $t; do @LIVE_SH@ && return 0; done; return 1; }
free() { ! (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; }
how=0
kill -TERM -- -$g 2>/dev/null || kill -TERM $g 2>/dev/null; kill -TERM $t 2>/dev/null
for i in $(seq $steps); do alive || break; sleep 0.1; done
if alive; then
  how=10; kill -KILL -- -$g 2>/dev/null; kill -KILL $g $t 2>/dev/null
  for i in $(seq 30); do alive || break; sleep 0.1; done
  alive && exit 3
fi
for i in $(seq 100); do free && break; sleep 0.1; done
free || exit 4
if [ -n "$state" ]; then rm -f -- "$state"; fi
exit $how
