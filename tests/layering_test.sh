#!/usr/bin/env bash
# The folders' allowed dependencies (README.md, "Folders"), checked on the
# sources: a violation names the file and the rule it breaks.
#   - worker/ includes nothing from coordinator/ (what both share is in
#     common/);
#   - the coordinator's analyses include no passes (analyses are read-only
#     and passes use them, not the reverse);
#   - common/ includes neither coordinator/ nor worker/;
#   - libtorch stays in worker/ and its tests.
set -u
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root" || exit 2
status=0
check() {
  local rule="$1" hits="$2"
  if [ -n "$hits" ]; then
    echo "layering: $rule:"
    echo "$hits" | sed 's/^/  /'
    status=1
  fi
}
src='--include=*.h --include=*.cc --include=*.hpp --include=*.cpp'
check "worker/ must not include coordinator/ (move what both sides need to common/)" \
  "$(grep -rn $src '#include *"coordinator/' worker/)"
check "coordinator/analysis must not include passes (an analysis is read-only; passes use analyses)" \
  "$(grep -rn $src '#include *"coordinator/passes/' coordinator/analysis/ 2>/dev/null)"
check "common/ must not include coordinator/ or worker/" \
  "$(grep -rnE $src '#include *"(coordinator|worker)/' common/)"
check "libtorch only in worker/ and its tests" \
  "$(grep -rnE $src '#include *[<"](torch|ATen|c10)/' common/ coordinator/ bench/ client/ 2>/dev/null)"
[ $status -eq 0 ] && echo "layering: ok"
exit $status
