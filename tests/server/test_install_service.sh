#!/usr/bin/env bash
# tests/server/test_install_service.sh: scripts/install-service into a staging
# root installs the binary, unit and environment file, keeps an existing
# environment file, and the unit's ExecStart names a binary that runs.
set -u
src=${DSV4_SOURCE_ROOT:?}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2" >&2; fail=1; fi; }
# The script uses build/server/dsv4 of the source tree; point a private copy at this build's binary.
mkdir -p "$d/src/build/server" "$d/src/scripts" "$d/src/docs"
cp "$src/scripts/install-service" "$src/scripts/dsv4.service" "$d/src/scripts/"
cp "$src/README.md" "$d/src/"; cp "$src/docs/api.md" "$src/docs/two-gb10.md" "$d/src/docs/"
cp "${DSV4_BIN:?}" "$d/src/build/server/dsv4"
out=$("$d/src/scripts/install-service" --destdir "$d/root" --model /models/x 2>&1)
check '[ $? -eq 0 ]' "install-service exits 0 ($out)"
check '[ -x "$d/root/opt/dsv4/bin/dsv4" ]' "binary installed"
check '"$d/root/opt/dsv4/bin/dsv4" version | grep -q "^dsv4 "' "installed binary runs"
check 'grep -q "^Type=notify" "$d/root/etc/systemd/system/dsv4.service"' "unit is Type=notify"
check 'grep -q "^WatchdogSec=" "$d/root/etc/systemd/system/dsv4.service"' "unit has a watchdog"
check 'grep -q "^Restart=on-failure" "$d/root/etc/systemd/system/dsv4.service"' "unit restarts on failure"
check 'grep -q "^ExecStart=/opt/dsv4/bin/dsv4 serve --model \${DSV4_MODEL} --api-key-file %d/api-key \$DSV4_ARGS" "$d/root/etc/systemd/system/dsv4.service"' "ExecStart uses the environment file and the key credential"
# issue 17: no open server on the network: a random key in a root-only file, passed as a credential
k="$d/root/etc/dsv4/api-key"
check '[ -f "$k" ] && [ "$(stat -c %a "$k")" = 600 ]' "API key file generated with mode 600"
check 'grep -Eq "^sk-[0-9a-f]{48}$" "$k"' "API key is 24 random bytes in hex"
check 'grep -q "^LoadCredential=api-key:/etc/dsv4/api-key" "$d/root/etc/systemd/system/dsv4.service"' "unit loads the key as a credential"
check '! grep -q "API_KEY=" "$d/root/etc/dsv4/dsv4.env"' "no key in the environment file"
key1=$(cat "$k")
"$d/root/opt/dsv4/bin/dsv4" serve --model /nonexistent --host 0.0.0.0 >/dev/null 2>"$d/err"
check 'grep -q -- "--allow-unauthenticated" "$d/err"' "the installed binary refuses 0.0.0.0 without a key"
check 'grep -q "^DSV4_MODEL=/models/x" "$d/root/etc/dsv4/dsv4.env"' "environment file written with --model"
echo "DSV4_MODEL=/keep/me" > "$d/root/etc/dsv4/dsv4.env"
"$d/src/scripts/install-service" --destdir "$d/root" >/dev/null 2>&1
check 'grep -q "^DSV4_MODEL=/keep/me" "$d/root/etc/dsv4/dsv4.env"' "an existing environment file is kept"
check '[ "$(cat "$k")" = "$key1" ]' "an existing API key is kept"
"$d/src/scripts/install-service" --bogus >/dev/null 2>&1
check '[ $? -eq 2 ]' "unknown option exits 2"
"$d/src/scripts/install-service" --help >"$d/help" 2>&1
check '[ $? -eq 0 ] && grep -q "^  scripts/install-service \[--model DIR\]" "$d/help" && ! grep -q "set -\|^#" "$d/help"' \
	"--help prints only the usage, exit 0"
[ $fail -eq 0 ] && echo "install-service: ok"
exit $fail
