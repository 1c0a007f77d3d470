#!/bin/sh
# The programs some tests need that pip cannot give, installed by `make test` and
# nothing more:
#
#   chromium  Debian's package, with --no-install-recommends (about 25 packages,
#             414 MB on Debian 12), for the browser tests; needs root.
#   pgbouncer Debian's package, with --no-install-recommends, for the tests behind a
#             pooler (they start instances of their own); needs root; its service is
#             neither started nor left enabled.
#   promtool  the one binary taken out of Debian's prometheus package
#             (apt-get download, not installed: no server, no user, no service)
#             into the venv's bin folder, for the check of the alert rules.
#
# No service starts while apt-get runs (a policy-rc.d that refuses every start,
# written for the install and removed after it when there was none), and the
# links by which a package enables a unit or an init script at boot
# (/etc/systemd/system/*.wants, /etc/rc?.d) are removed again when the install
# created them. What was installed is said in one line.
#
# Usage: tests/install_tools.sh VENV_BIN
# KIRIM_TOOLS_ROOT puts /etc, /usr/sbin and /usr/bin under another folder (the
# script's own test runs it that way with a stand-in apt-get).
set -u
BIN=${1:?usage: install_tools.sh VENV_BIN}
ROOT=${KIRIM_TOOLS_ROOT:-}
CHROMIUM=$ROOT/usr/bin/chromium
PGBOUNCER=$ROOT/usr/sbin/pgbouncer
POLICY=$ROOT/usr/sbin/policy-rc.d
LINKS="$ROOT/etc/systemd/system $ROOT/etc/systemd/user $ROOT/etc/rc0.d $ROOT/etc/rc1.d \
$ROOT/etc/rc2.d $ROOT/etc/rc3.d $ROOT/etc/rc4.d $ROOT/etc/rc5.d $ROOT/etc/rc6.d $ROOT/etc/rcS.d"
APT="apt-get -o DPkg::Lock::Timeout=600 -q"
work=$(mktemp -d)
wrote_policy=

say() { echo "make test: $*"; }

links() {  # every enablement link, one a line, sorted
    for dir in $LINKS; do [ -d "$dir" ] && find "$dir" -type l; done | sort
}

cleanup() {
    [ -n "$wrote_policy" ] && rm -f "$POLICY"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_package() {  # PACKAGE WHAT: Debian's package, without recommends or services
    package=$1
    what=$2
    if [ "$(id -u)" != 0 ] && [ -z "$ROOT" ]; then
        say "not root: $package not installed, $what will skip"
        return
    fi
    links > "$work/links.before"
    dpkg-query -W -f='${Package}\n' 2>/dev/null | sort > "$work/packages.before"
    if [ ! -e "$POLICY" ]; then
        mkdir -p "$(dirname "$POLICY")"
        printf '#!/bin/sh\n# written by kirim tests/install_tools.sh for one apt-get run\nexit 101\n' \
            > "$POLICY" && chmod 0755 "$POLICY" && wrote_policy=1
    fi
    if ! { $APT update -qq && DEBIAN_FRONTEND=noninteractive \
        $APT install -y -qq --no-install-recommends \
        -o APT::Keep-Downloaded-Packages=false "$package"; } > "$work/apt.log" 2>&1; then
        tail -5 "$work/apt.log"
        say "$package could not be installed here: $what will skip"
    fi
    links | comm -13 "$work/links.before" - | while read -r link; do
        rm -f "$link" && say "disabled $(basename "$link") (enabled by the install)"
    done
    dpkg-query -W -f='${Package}\n' 2>/dev/null | sort | comm -13 "$work/packages.before" - \
        > "$work/packages.new"
    count=$(wc -l < "$work/packages.new")
    [ "$count" -gt 0 ] && say "installed $count Debian packages for $package: $(tr '\n' ' ' \
        < "$work/packages.new")"
    if [ -n "$wrote_policy" ]; then
        rm -f "$POLICY"
        wrote_policy=
    fi
}

install_promtool() {
    # apt-get download works without root; it writes where it runs, as the _apt user
    # when it can, so the folder is open to it
    chmod 0777 "$work"
    if ! (cd "$work" && $APT download prometheus) > "$work/download.log" 2>&1; then
        [ "$(id -u)" = 0 ] && $APT update -qq > /dev/null 2>&1
        (cd "$work" && $APT download prometheus) > "$work/download.log" 2>&1
    fi
    deb=$(ls "$work"/prometheus_*.deb 2>/dev/null | head -1)
    if [ -n "$deb" ] && dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" ./usr/bin/promtool \
        && install -m 0755 "$work/usr/bin/promtool" "$BIN/promtool"; then
        say "installed $BIN/promtool (out of Debian's $(basename "$deb"); no server)"
    else
        tail -3 "$work/download.log"
        say "promtool could not be installed here: its check of the alert rules will skip"
    fi
}

[ -x "$CHROMIUM" ] || install_package chromium "the browser tests"
[ -x "$PGBOUNCER" ] || { [ -z "$ROOT" ] && command -v pgbouncer > /dev/null; } || \
    install_package pgbouncer "the tests behind a pooler"
command -v promtool > /dev/null || [ -x "$BIN/promtool" ] || install_promtool
exit 0
