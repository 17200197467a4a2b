#!/usr/bin/env bash
# The folders' allowed dependencies (README.md, "Folders"), checked on the
# sources: a violation names the file and the rule it breaks.
#   - worker/ includes nothing from coordinator/ (what both share is in
#     common/);
#   - the coordinator's analyses include no passes (analyses are read-only
#     and passes use them, not the reverse);
#   - common/ includes neither coordinator/ nor worker/;
#   - libtorch stays in worker/ and its tests;
#   - no cycle between folders (worker/runtime, common/sim, ...: the first
#     two path components), whatever the direction it is closed in
#     (tests/layering_cycles.py names the includes);
#   - worker/runtime includes nothing of the worker above it (models, data,
#     checkpoint, trainer, agent: they build on the runtime);
#   - gRPC in common/ only in its one credentials target
#     (common/security/grpc_credentials.*, tandem_security_grpc).
# And the tests' layout (README.md, "Folders"):
#   - tests/unit mirrors the source folders: a folder there that holds tests
#     (or a CMakeLists.txt) is named after the folder it tests
#     (tests/unit/common/ir tests common/ir);
#   - tests that start a coordinator (its binary, its server in-process, or
#     the harness that starts one: tandem_harness) live with the integration
#     tests; tests/unit/coordinator/rpc, the
#     server's own tests, is the one unit folder that starts its server;
#   - the Python suites import tests/harness/tandem_harness.py as a module:
#     no conftest.py (nor the harness) is loaded by file path;
#   - one fake worker: a worker's behaviour towards the coordinator (acking
#     a schedule switch, ScheduleApplied) is written only in worker/agent
#     (the real one) and bench/load/fake_worker.* (the fake, which the load
#     bench and the coordinator's RPC tests run); other tests script single
#     messages (tandem_harness.ScriptedSession) or, in the coordinator's own
#     unit tests, feed its managers.
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
check "worker/runtime must not include the worker above it (models, data, checkpoint, trainer, agent build on the runtime; move the shared part into runtime/ or common/)" \
  "$(grep -rnE $src '#include *"worker/' worker/runtime/ | grep -v '#include *"worker/runtime/')"
check "gRPC in common/ only in common/security/grpc_credentials.* (tandem_security_grpc; the rest of common/ has no gRPC runtime)" \
  "$(grep -rnE $src '#include *[<"](grpc|grpcpp)/' common/ | grep -v '^common/security/grpc_credentials\.')"
check "no include cycle between folders (one direction of each must go: move what both need below them)" \
  "$(/usr/bin/python3 "$root/tests/layering_cycles.py" "$root")"
mirror=""
while IFS= read -r d; do
  rel="${d#tests/unit/}"
  if [ ! -d "$rel" ] && [ -n "$(find "$d" -maxdepth 1 -type f \( -name '*_test.cc' -o -name 'test_*.py' -o -name CMakeLists.txt \))" ]; then
    mirror+="$d (no folder $rel)"$'\n'
  fi
done < <(find tests/unit -mindepth 1 -type d | sort)
check "tests/unit mirrors the source folders (move the tests under tests/unit/<the folder they test>)" \
  "${mirror%$'\n'}"
check "a test that starts a coordinator belongs in tests/integration (only tests/unit/coordinator/rpc, the server's own tests, starts its server)" \
  "$(grep -rnE 'CoordinatorServer|coordinator_binary|tandem_harness|tandem-coordinator\b.*(Popen|subprocess|execv|posix_spawn)|(Popen|subprocess|execv|posix_spawn).*tandem-coordinator\b' tests/unit | grep -v '^tests/unit/coordinator/rpc/')"
check "no conftest.py (nor the harness) loaded by file path (import tandem_harness; tests/pytest.ini puts tests/harness on the path)" \
  "$(grep -rnE --include='*.py' '(spec_from_file_location|SourceFileLoader|run_path|exec\(open)\(.*(conftest|tandem_harness)' tests client bench 2>/dev/null | grep -v '^client/python/build/')"
check "one fake worker: acking schedules (ScheduleApplied) only in worker/agent and bench/load/fake_worker.* (drive a FakeRank, or script single messages)" \
  "$(grep -rnE --include='*.cc' --include='*.h' --include='*.py' 'mutable_applied\(\)|set_allocated_applied|ScheduleApplied\(|\.applied\.[a-z_]+ *=' worker bench tests client 2>/dev/null | grep -vE '^(worker/agent/|bench/load/fake_worker\.|tests/unit/coordinator/|client/python/build/)' | grep -vE '_pb2(_grpc)?\.py:')"
[ $status -eq 0 ] && echo "layering: ok"
exit $status
