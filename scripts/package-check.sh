#!/usr/bin/env bash
# The packaging check (issue 9): builds the Debian package and proves it installs a working
# system service and a usable C library. Run as root (CI does); a few minutes on 2 cores once
# the release build is warm.
#
#   scripts/package-check.sh
#
#  1. build     scripts/package.sh (release build, man pages, completions, cargo-deb)
#  2. contents  every asset where it belongs (dpkg-deb -c), the conffile listed, the soname
#               links, man pages gzipped and one per subcommand, maintainer scripts
#  3. install   dpkg --root into a scratch root (maintainer scripts run chrootless with
#               DPKG_ROOT; a policy-rc.d keeps them from starting anything): the group is
#               created, the unit enabled, the files are the packaged ones
#  4. unit      systemd-analyze verify (with ExecStart pointing into the scratch root and
#               its man pages on MANPATH) and systemd-analyze security
#  5. run       the installed gpushared started as the unit would start it (its ExecStart,
#               Group=, CapabilityBoundingSet=, NoNewPrivileges=, LimitMEMLOCK=/NOFILE= and,
#               through a cgroup-v1 device controller, DevicePolicy=closed + DeviceAllow=),
#               with a stand-in group for `gpushare`. A C client built only from
#               `pkg-config --cflags --libs gpushare` (sysroot = the scratch root) runs as
#               an unprivileged group member and passes; a non-member is refused;
#               `gpushare status` works; `gpushare run` gives a program the installed CUDA
#               driver, which connects; SIGHUP (`systemctl reload`) re-reads the edited
#               policy under a live client; SIGTERM removes the socket
#  6. upgrade   reinstalling keeps the admin's edited policy file; an upgrade whose default
#               policy changed keeps it too (--force-confold, the new default beside it as
#               .dpkg-dist); removal removes a killed broker's stale socket and keeps the
#               policy file; purge removes it and the unit's state, keeps the group
#  7. repro     packaging the same build again gives the same .deb, byte for byte
#
# What it cannot do here: start the unit under a real systemd (CI containers have none as
# PID 1); step 5 reproduces the unit's process settings instead, and step 4 checks the file.
# `check && ok ... || problem ...` reads as if-then-else here because ok never fails.
# shellcheck disable=SC2015
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ok() { printf '   ok  %s\n' "$*"; }
note() { printf '   --  %s\n' "$*"; }
problems=()
# A failed check that later steps do not depend on: reported, and the check goes on.
problem() {
    printf '\033[1;31m   FAIL\033[0m %s\n' "$*"
    problems+=("$*")
}
# A failure the rest cannot go on from.
die() {
    printf '\n\033[1;31mpackage-check FAILED:\033[0m %s\n' "$*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] ||
    die "run as root: it installs into a scratch root and starts the broker with the unit's credentials"

# Tools: what is missing comes from apt (systemd only for systemd-analyze; nothing is started).
need_apt=()
need() { command -v "$1" >/dev/null 2>&1 || need_apt+=("$2"); }
need cc gcc
need pkg-config pkg-config
need dpkg-deb dpkg
need dpkg-architecture dpkg-dev
need readelf binutils
need strip binutils
need systemd-analyze systemd
need setpriv util-linux
need groupadd passwd
need deb-systemd-helper init-system-helpers
if ((${#need_apt[@]})); then
    note "installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/gpushare-package-check.XXXXXX)
chmod 755 "$work" # the unprivileged client runs from here
root=$work/root
pids=()
cgroup=
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    [[ -n $cgroup ]] && rmdir "$cgroup" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------------------
step "1. build the package (scripts/package.sh)"
deb=$(./scripts/package.sh | tail -n 1)
[[ -f $deb ]] || die "scripts/package.sh did not print the path of a package"
ok "$deb ($(du -h "$deb" | cut -f1))"
dbgsym=$(dirname "$deb")/$(basename "$deb" .deb | sed 's/^gpushare_/gpushare-dbgsym_/').ddeb
[[ -f $dbgsym ]] && ok "debug symbols: $(basename "$dbgsym")" || problem "no $dbgsym"

ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$ma
deb_version=$(dpkg-deb -f "$deb" Version)
version=${deb_version%-*}
[[ $(dpkg-deb -f "$deb" Package) == gpushare ]] || problem "package name is not gpushare"

# ---------------------------------------------------------------------------------------
step "2. contents"
contents=$(dpkg-deb -c "$deb" | awk '{ $2 = ""; $3 = ""; $4 = ""; $5 = ""; print }' | tr -s ' ')
# has TYPE+MODE PATH [-> TARGET]: one line of `dpkg-deb -c`, owner, size and date left out.
has() {
    if grep -qxF -- "$1 ./$2" <<<"$contents"; then
        ok "./$2 ($1)"
    else
        problem "the package lacks ./$2 as '$1' (has: $(grep -F -- "./${2%% ->*}" <<<"$contents" || echo nothing))"
    fi
}
has -rwxr-xr-x usr/bin/gpushared
has -rwxr-xr-x usr/bin/gpushare
has -rwxr-xr-x usr/bin/gpushare-demo
has -rwxr-xr-x usr/bin/gpushare-k8s-plugin
has -rw-r--r-- "$libdir/libgpushare.so.$version"
has lrwxrwxrwx "$libdir/libgpushare.so.0 -> libgpushare.so.$version"
has lrwxrwxrwx "$libdir/libgpushare.so -> libgpushare.so.0"
# Where `gpushare run` looks for them beside /usr/bin/gpushare.
has -rw-r--r-- usr/lib/gpushare/libgpushare_interpose.so
has -rw-r--r-- usr/lib/gpushare/libgpushare_audit.so
has -rw-r--r-- usr/lib/gpushare/cuda/libcuda.so.1
has lrwxrwxrwx "usr/lib/gpushare/cuda/libcuda.so -> libcuda.so.1"
has -rw-r--r-- usr/lib/gpushare/cuda/libnvidia-ml.so.1
has -rw-r--r-- usr/include/gpushare.h
has -rw-r--r-- "$libdir/pkgconfig/gpushare.pc"
has -rw-r--r-- usr/lib/systemd/system/gpushared.service
has -rw-r--r-- etc/gpushare/gpushare.toml
has -rw-r--r-- usr/share/man/man8/gpushared.8.gz
has -rw-r--r-- usr/share/man/man1/gpushare.1.gz
has -rw-r--r-- usr/share/bash-completion/completions/gpushare
has -rw-r--r-- usr/share/zsh/vendor-completions/_gpushare
has -rw-r--r-- usr/share/fish/vendor_completions.d/gpushare.fish
has -rw-r--r-- usr/share/gpushare/grafana/gpushare.json
for script in prolog epilog task-prolog; do
    has -rwxr-xr-x "usr/share/gpushare/slurm/$script"
done
for example in slurm.conf gres.conf gpushare.toml; do
    has -rw-r--r-- "usr/share/gpushare/slurm/$example.example"
done
for manifest in plugin example-pod; do
    has -rw-r--r-- "usr/share/gpushare/kubernetes/$manifest.yaml"
done
uncompressed=$(grep -E '^-.* \./usr/share/man/' <<<"$contents" | grep -v '\.gz$' || true)
[[ -z $uncompressed ]] && ok "every man page is gzipped" || problem "uncompressed man pages: $uncompressed"

dpkg-deb -e "$deb" "$work/control"
conffiles=$(cat "$work/control/conffiles" 2>/dev/null || true)
[[ $conffiles == /etc/gpushare/gpushare.toml ]] &&
    ok "conffiles: $conffiles" || problem "conffiles is '$conffiles', not /etc/gpushare/gpushare.toml"
# shellcheck disable=SC2016 # the script's own text, not an expansion
grep -q 'deb-systemd-helper enable gpushared.service' "$work/control/postinst" &&
    grep -q 'deb-systemd-invoke $_dh_action gpushared.service' "$work/control/postinst" &&
    ok "postinst enables and (re)starts gpushared.service" || problem "postinst lacks the systemd section"
grep -q 'deb-systemd-invoke stop gpushared.service' "$work/control/prerm" &&
    ok "prerm stops gpushared.service on removal" || problem "prerm lacks the systemd section"
grep -q 'deb-systemd-helper purge gpushared.service' "$work/control/postrm" &&
    ok "postrm forgets the unit on purge" || problem "postrm lacks the systemd section"
grep -q '^#DEBHELPER#' "$work/control/postinst" "$work/control/prerm" "$work/control/postrm" &&
    problem "a maintainer script still has its #DEBHELPER# marker" || true
for script in postinst prerm postrm; do
    sh -n "$work/control/$script" || problem "$script: shell syntax error"
done

# ---------------------------------------------------------------------------------------
step "3. install into a scratch root (dpkg --root, scripts chrootless)"
mkdir -p "$root"/var/lib/dpkg/{info,updates,triggers,alternatives} "$root"/var/log \
    "$root"/etc "$root"/usr/sbin "$root"/run
touch "$root"/var/lib/dpkg/{status,available}
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:*:19000:0:99999:7:::\n' >"$root/etc/shadow"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'root:*::\n' >"$root/etc/gshadow"
# The Debian way to say "install, but start nothing": deb-systemd-invoke asks it.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
# --force-depends: the scratch root has no libc6 or adduser; the host's serve.
dpkg_root() {
    dpkg --root="$root" --force-script-chrootless --force-depends \
        --log="$root/var/log/dpkg.log" "$@" >"$work/dpkg.out" 2>&1 ||
        die "dpkg $*: $(cat "$work/dpkg.out")"
}
status_of() {
    dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Status} ${Version}' gpushare 2>/dev/null || true
}
dpkg_root -i "$deb"
[[ $(status_of) == "install ok installed $deb_version" ]] &&
    ok "dpkg: $(status_of)" || die "after dpkg -i the status is '$(status_of)'"
grep -q '^gpushare:' "$root/etc/group" &&
    ok "postinst created the group: $(grep '^gpushare:' "$root/etc/group")" ||
    problem "postinst did not create the gpushare group"
[[ -L $root/etc/systemd/system/multi-user.target.wants/gpushared.service ]] &&
    ok "postinst enabled the unit (multi-user.target.wants/gpushared.service)" ||
    problem "postinst did not enable gpushared.service"
cmp -s "$root/etc/gpushare/gpushare.toml" packaging/gpushare.toml &&
    ok "/etc/gpushare/gpushare.toml is packaging/gpushare.toml" || problem "installed policy file differs"
cmp -s "$root/usr/share/gpushare/grafana/gpushare.json" packaging/grafana/gpushare.json &&
    ok "the Grafana dashboard is packaging/grafana/gpushare.json" || problem "installed dashboard differs"
for script in prolog epilog task-prolog; do
    cmp -s "$root/usr/share/gpushare/slurm/$script" "packaging/slurm/$script" &&
        ok "the Slurm $script is packaging/slurm/$script" || problem "installed Slurm $script differs"
done
cmp -s "$root/usr/lib/systemd/system/gpushared.service" packaging/gpushared.service &&
    ok "the installed unit is packaging/gpushared.service" || problem "installed unit differs"
soname=$(readelf -d "$root/$libdir/libgpushare.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libgpushare.so.0 ]] && ok "SONAME $soname" || problem "the library's SONAME is '$soname', not libgpushare.so.0"
[[ $(readlink -f "$root/$libdir/libgpushare.so") == "$root/$libdir/libgpushare.so.$version" ]] &&
    ok "libgpushare.so -> libgpushare.so.0 -> libgpushare.so.$version" || problem "the library links do not resolve"
got=$("$root/usr/bin/gpushared" --version)
[[ $got == "gpushared $version" ]] && ok "$got" || problem "gpushared --version says '$got'"

# One page per subcommand that `gpushare --help` lists.
mapfile -t subcommands < <("$root/usr/bin/gpushare" --help |
    sed -n '/^Commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }' | grep -vx help)
for sub in "${subcommands[@]}"; do
    [[ -f $root/usr/share/man/man1/gpushare-$sub.1.gz ]] || problem "no man page gpushare-$sub(1)"
done
ok "man pages for gpushare's ${#subcommands[@]} subcommands (${subcommands[*]})"
for page in "$root"/usr/share/man/man*/*.gz; do
    gzip -t "$page" || problem "$page is not valid gzip"
done
if command -v man >/dev/null 2>&1; then
    for page in "$root"/usr/share/man/man*/*.gz; do
        warnings=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null)
        [[ -z $warnings ]] || problem "$(basename "$page"): groff warnings: $warnings"
    done
    MANPATH=$root/usr/share/man man -w gpushared gpushare >/dev/null &&
        ok "man finds gpushared(8) and gpushare(1); groff renders every page without warnings" ||
        problem "man does not find the pages"
else
    note "no man(1) here: pages not rendered"
fi
bash -c "source '$root/usr/share/bash-completion/completions/gpushare' && complete -p gpushare" >/dev/null &&
    ok "bash completion registers for gpushare" || problem "bash completion does not load"
[[ $(head -n 1 "$root/usr/share/zsh/vendor-completions/_gpushare") == "#compdef gpushare" ]] &&
    ok "zsh completion is a #compdef gpushare function" || problem "zsh completion malformed"
grep -q '^complete -c gpushare ' "$root/usr/share/fish/vendor_completions.d/gpushare.fish" &&
    ok "fish completion completes gpushare" || problem "fish completion malformed"

# ---------------------------------------------------------------------------------------
step "4. the unit: systemd-analyze verify, security"
unit=$root/usr/lib/systemd/system/gpushared.service
mkdir -p "$work/unit"
sed "s#^ExecStart=/usr/bin/gpushared #ExecStart=$root/usr/bin/gpushared #" "$unit" >"$work/unit/gpushared.service"
man_check=yes
command -v man >/dev/null 2>&1 || man_check=no
if out=$(MANPATH=$root/usr/share/man systemd-analyze verify --man=$man_check "$work/unit/gpushared.service" 2>&1) && [[ -z $out ]]; then
    ok "systemd-analyze verify: clean (ExecStart in the scratch root; Documentation= man pages found: $man_check)"
else
    problem "systemd-analyze verify: ${out:-failed}"
fi
exposure=$(systemd-analyze security --offline=yes "$work/unit/gpushared.service" 2>/dev/null |
    sed -n 's/.*Overall exposure level for gpushared.service: \([0-9.]*\).*/\1/p')
if [[ -n $exposure ]] && awk -v e="$exposure" 'BEGIN { exit !(e <= 4.5) }'; then
    ok "systemd-analyze security: exposure $exposure (10 is an unsandboxed root service)"
else
    problem "systemd-analyze security: exposure '${exposure:-?}' (this check allows at most 4.5)"
fi

# ---------------------------------------------------------------------------------------
step "5. run it as the unit would: C client through pkg-config, group access, reload"
# The unit's settings, read from the installed unit so that this runs what ships.
setting() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
exec_start=$(setting ExecStart)
[[ $(setting Group) == gpushare ]] || problem "the unit's Group= is not gpushare"
caps=$(setting CapabilityBoundingSet | tr '[:upper:]' '[:lower:]' | sed 's/cap_/+/g; s/ /,/g')
memlock=$(setting LimitMEMLOCK | sed 's/infinity/unlimited/')
nofile=$(setting LimitNOFILE | sed 's/infinity/unlimited/')
[[ $(setting NoNewPrivileges) == yes ]] || problem "the unit lacks NoNewPrivileges=yes"
# `gpushare` exists only in the scratch root: a host group stands in for it, nobody is its
# member, daemon is an outsider.
group=nogroup
member=nobody
outsider_gid=$(getent group daemon | cut -d: -f3)
getent group "$group" >/dev/null && id "$member" >/dev/null 2>&1 && [[ -n $outsider_gid ]] ||
    die "this check needs the host's nobody user and nogroup and daemon groups"
rundir=$work/run/gpushare # RuntimeDirectory=gpushare, RuntimeDirectoryMode=0750
mkdir -p "$rundir"
chown "root:$group" "$rundir"
chmod "$(setting RuntimeDirectoryMode)" "$rundir"
socket=$rundir/gpushare.sock
cmdline=$(sed -e "s#^/usr/bin/#$root/usr/bin/#" -e "s# /etc/gpushare/# $root/etc/gpushare/#g" \
    -e "s# /run/gpushare/# $rundir/#g" -e "s#--socket-group gpushare#--socket-group $group#" \
    <<<"$exec_start")
read -r -a broker_cmd <<<"$cmdline"
note "ExecStart: ${cmdline//$work/\$WORK}"
note "credentials: uid 0, gid $group, bounding set ${caps//+/}, no_new_privs, memlock $memlock, nofile $nofile"

# DevicePolicy=closed + DeviceAllow= as systemd sets them up on a cgroup-v1 host: the
# standard pseudo devices, pts, and each DeviceAllow= entry resolved against /proc/devices.
if [[ $(setting DevicePolicy) == closed && -w /sys/fs/cgroup/devices/cgroup.procs ]]; then
    cgroup=/sys/fs/cgroup/devices/gpushare-package-check.$$
    mkdir "$cgroup"
    echo a >"$cgroup/devices.deny"
    for rule in 'c 1:3 rwm' 'c 1:5 rwm' 'c 1:7 rwm' 'c 1:8 rwm' 'c 1:9 rwm' 'c 5:0 rwm' \
        'c 5:2 rwm' 'c 136:* rw'; do
        echo "$rule" >"$cgroup/devices.allow"
    done
    allowed=()
    while read -r spec perms; do
        [[ $spec == char-* ]] || { problem "DeviceAllow=$spec: only char- groups are emulated here"; continue; }
        pattern=${spec#char-}
        while read -r major name; do
            # shellcheck disable=SC2053 # the unit's pattern is a glob
            if [[ $name == $pattern ]]; then
                echo "c $major:* $perms" >"$cgroup/devices.allow"
                allowed+=("$name")
            fi
        done < <(sed -n '/^Character devices:/,/^$/p' /proc/devices | sed 1d)
    done < <(sed -n 's/^DeviceAllow=//p' "$unit")
    note "device cgroup: pseudo devices + ${allowed[*]:-no NVIDIA device groups on this machine}"
    in_cgroup() { echo "$BASHPID" >"$cgroup/cgroup.procs" && exec "$@"; }
    if [[ -e /dev/kmsg ]]; then
        if (in_cgroup sh -c ': </dev/kmsg') 2>/dev/null; then
            problem "the device cgroup does not deny /dev/kmsg: the emulation is not in force"
        else
            ok "inside the device cgroup /dev/kmsg is denied, as the unit would deny it"
        fi
    fi
else
    note "no writable cgroup-v1 device controller here: DevicePolicy= is not reproduced"
    in_cgroup() { exec "$@"; }
fi

# systemd raises the limits as PID 1; here that takes CAP_SYS_RESOURCE, which containers
# often withhold: then the broker runs under the current limits, and says so.
limits=()
for limit in "memlock=$memlock" "nofile=$nofile"; do
    if prlimit --"$limit" true 2>/dev/null; then
        limits+=(--"$limit")
    else
        note "cannot raise the ${limit%%=*} limit here (no CAP_SYS_RESOURCE?): the broker gets the current $(prlimit --noheadings --output SOFT,HARD --"${limit%%=*}")"
    fi
done
# MemoryDenyWriteExecute=yes: systemd 252 does it with seccomp; the kernel's PR_SET_MDWE
# (6.3 and later) refuses the same mappings, and survives the execs below.
mdwe=()
if [[ $(setting MemoryDenyWriteExecute) == yes ]]; then
    cat >"$work/mdwe.c" <<'EOF_C'
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    if (prctl(65 /* PR_SET_MDWE */, 1UL /* PR_MDWE_REFUSE_EXEC_GAIN */, 0UL, 0UL, 0UL) != 0) {
        perror("prctl(PR_SET_MDWE)");
        return 127;
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
EOF_C
    if cc -o "$work/mdwe" "$work/mdwe.c" && "$work/mdwe" true 2>/dev/null; then
        mdwe=("$work/mdwe")
        note "MemoryDenyWriteExecute=yes as PR_SET_MDWE"
    else
        note "this kernel has no PR_SET_MDWE: MemoryDenyWriteExecute= is not reproduced"
    fi
fi
start_broker() {
    (in_cgroup "${mdwe[@]}" prlimit "${limits[@]}" \
        setpriv --reuid=0 --regid="$group" --init-groups --bounding-set="-all,$caps" \
        --inh-caps=-all --no-new-privs -- "${broker_cmd[@]}") >>"$work/broker.log" 2>&1 &
    broker=$!
    pids+=("$broker")
    for _ in $(seq 100); do
        [[ -S $socket ]] && return 0
        kill -0 "$broker" 2>/dev/null || die "gpushared exited at start: $(cat "$work/broker.log")"
        sleep 0.1
    done
    die "gpushared did not create $socket in 10 s: $(cat "$work/broker.log")"
}
start_broker
caps_now=$(sed -n 's/^CapEff:[[:space:]]*//p' "/proc/$broker/status")
[[ $(sed -n 's/^NoNewPrivs:[[:space:]]*//p' "/proc/$broker/status") == 1 &&
    $caps_now == $(sed -n 's/^CapBnd:[[:space:]]*//p' "/proc/$broker/status") ]] &&
    ok "gpushared runs with the unit's credentials (CapEff $caps_now = its bounding set, NoNewPrivs 1)" ||
    problem "gpushared's credentials are not the unit's: $(grep -E '^(Cap|NoNewPrivs)' "/proc/$broker/status" | tr '\n' ' ')"
grep -i 'telemetry' "$work/broker.log" | head -n 2 | sed 's/^/   --  broker: /' || true
[[ $(stat -c '%U:%G %a' "$socket") == "root:$group 660" && $(stat -c '%U:%G %a' "$rundir") == "root:$group 750" ]] &&
    ok "socket root:$group 660 in a root:$group 750 directory" ||
    problem "socket/directory ownership: $(stat -c '%U:%G %a %n' "$socket" "$rundir")"

# The C client: compiled from nothing but pkg-config's answer, with the scratch root as
# the sysroot (pkg-config prefixes -I/-L with it) and its pkgconfig directory the only one.
pc() {
    PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/$libdir/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
pc --exists gpushare || die "pkg-config does not find gpushare in the scratch root"
cflags=$(pc --cflags gpushare | xargs)
libs=$(pc --libs gpushare | xargs)
[[ $cflags == "-I$root/usr/include" && $libs == "-L$root/$libdir -lgpushare" ]] &&
    ok "pkg-config --cflags --libs gpushare: ${cflags//$work/\$WORK} ${libs//$work/\$WORK}" ||
    problem "pkg-config says '$cflags' '$libs'"
# shellcheck disable=SC2086 # pkg-config output is a list of flags
cc -std=c11 -Wall -Wextra -Werror $cflags packaging/test/client.c $libs -o "$work/client" ||
    die "the C client does not build from pkg-config's flags"
needed=$(readelf -d "$work/client" | sed -n 's/.*(NEEDED).*\[\(libgpushare[^]]*\)\].*/\1/p')
[[ $needed == libgpushare.so.0 ]] && ok "client built; it needs $needed (the soname)" ||
    problem "the client records '$needed', not libgpushare.so.0"

as_user() { # as_user GID COMMAND...: run as nobody with only that group
    local gid=$1
    shift
    setpriv --reuid="$member" --regid="$gid" --clear-groups \
        env GPUSHARE_SOCKET="$socket" LD_LIBRARY_PATH="$root/$libdir" "$@"
}
if out=$(as_user "$group" "$work/client" 2>&1) && grep -q 'client: ok' <<<"$out"; then
    ok "client as $member (group $group): $(tr '\n' ' ' <<<"$out")"
else
    problem "client as a group member failed: $out"
fi
if out=$(as_user "$outsider_gid" "$work/client" 2>&1); then
    problem "a user outside the group connected: $out"
else
    ok "outside the group: refused ($(tail -n 1 <<<"$out"))"
fi
if out=$(as_user "$group" "$root/usr/bin/gpushare" status 2>&1); then
    ok "gpushare status (as the member): $(head -n 1 <<<"$out")"
else
    problem "gpushare status failed: $out"
fi
# `gpushare run` (consolidated) with the installed driver and audit library: a program that
# opens libcuda.so.1, as the CUDA runtime does, gets gpushare's driver and connects.
cc -Wall -o "$work/cuda_app" tests/c/consolidated_app.c -ldl ||
    die "tests/c/consolidated_app.c does not build"
out=$(as_user "$group" "$root/usr/bin/gpushare" run -- "$work/cuda_app" init libcuda.so.1 2>&1) || true
if grep -qxF "driver $root/usr/lib/gpushare/cuda/libcuda.so.1" <<<"$out" &&
    grep -qx 'cuInit 0 0' <<<"$out"; then
    ok "gpushare run: the program got the installed CUDA driver, and its cuInit connected"
else
    problem "gpushare run with the installed driver: $out"
fi

# Reload: an admin edits the policy and runs `systemctl reload gpushared` (ExecReload sends
# SIGHUP) while a client is connected. The edit is kept for step 6.
# shellcheck disable=SC2016 # the unit's own text, not an expansion
[[ $(setting ExecReload) == '/bin/kill -HUP $MAINPID' ]] || problem "ExecReload= is not /bin/kill -HUP \$MAINPID"
mkfifo "$work/go"
exec 7<>"$work/go"
as_user "$group" "$work/client" --wait <"$work/go" >"$work/held.out" 2>&1 &
held=$!
pids+=("$held")
for _ in $(seq 100); do
    grep -q 'client: connected' "$work/held.out" && break
    sleep 0.1
done
grep -q 'client: class normal' "$work/held.out" ||
    problem "before the edit the client's class is not normal: $(cat "$work/held.out")"
cat >>"$root/etc/gpushare/gpushare.toml" <<'EOF'

# edited by package-check: an admin's change, which upgrades must keep
[[users]]
name = "nobody"
class = "best-effort"
EOF
kill -HUP "$broker"
sleep 0.5
if kill -0 "$broker" 2>/dev/null; then
    echo go >&7
    if wait "$held" && grep -q 'client: ok' "$work/held.out"; then
        ok "SIGHUP with a client connected: the client carried on and finished"
    else
        problem "the client connected across SIGHUP failed: $(cat "$work/held.out")"
    fi
    out=$(as_user "$group" "$work/client" 2>&1) || true
    grep -q 'client: class best-effort' <<<"$out" &&
        ok "after SIGHUP a new client gets the edited policy (class best-effort)" ||
        problem "after SIGHUP the edited policy is not in force: $out"
else
    problem "gpushared exited on SIGHUP, so \`systemctl reload gpushared\` would stop the service (log: $(tail -n 3 "$work/broker.log"))"
    echo go >&7
    wait "$held" 2>/dev/null || true
    start_broker
fi
exec 7>&-

kill -TERM "$broker"
if wait "$broker"; then
    [[ ! -e $socket ]] && ok "SIGTERM: exit status 0, socket removed" || problem "SIGTERM left $socket behind"
else
    problem "gpushared exited with status $? on SIGTERM"
fi

# ---------------------------------------------------------------------------------------
step "6. upgrade and removal keep the admin's policy file, leave no stale socket"
conf=$root/etc/gpushare/gpushare.toml
edited() { grep -q '^# edited by package-check' "$conf"; }
edited || die "the policy file lost its edit before step 6"
dpkg_root -i "$deb"
edited && [[ -z $(compgen -G "$conf.dpkg-*") ]] &&
    ok "reinstall: the edited policy file is untouched, nothing beside it" ||
    problem "reinstall changed the edited policy file"

# The next version, whose default policy file changed too: dpkg keeps the admin's and puts
# the new default beside it.
next=$version-1+check1
dpkg-deb -R "$deb" "$work/next"
sed -i "s/^Version: .*/Version: $next/" "$work/next/DEBIAN/control"
printf '\n# (a later default)\n' >>"$work/next/etc/gpushare/gpushare.toml"
dpkg-deb --root-owner-group -b "$work/next" "$work/next.deb" >/dev/null
dpkg_root --force-confold -i "$work/next.deb"
[[ $(status_of) == "install ok installed $next" ]] || problem "after the upgrade the status is '$(status_of)'"
edited && grep -q 'a later default' "$conf.dpkg-dist" 2>/dev/null &&
    ok "upgrade $deb_version -> $next: the edited policy file kept, the new default in gpushare.toml.dpkg-dist" ||
    problem "upgrade: policy file $(edited && echo kept || echo lost), .dpkg-dist $(ls "$conf".dpkg-* 2>/dev/null || echo missing)"

# A broker killed with SIGKILL leaves its socket; removal must not leave it behind.
mkdir -p "$root/run/gpushare"
stale=$root/run/gpushare/gpushare.sock
# (Started from a subshell, so that it is no job of this shell's and its SIGKILL goes
# unannounced.)
killed=$(
    "$root/usr/bin/gpushared" --backend sim --socket "$stale" --config "$conf" \
        >>"$work/broker.log" 2>&1 </dev/null &
    echo $!
)
pids+=("$killed")
for _ in $(seq 100); do
    [[ -S $stale ]] && break
    sleep 0.1
done
kill -KILL "$killed"
for _ in $(seq 100); do # dead: gone, or a zombie nobody has reaped yet
    [[ -e /proc/$killed ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$killed/status" 2>/dev/null || break
    sleep 0.05
done
[[ -S $stale ]] || die "could not make a stale socket"
dpkg_root -r gpushare
[[ ! -e $stale && ! -e $root/run/gpushare ]] && ok "remove: the killed broker's stale socket is gone" ||
    problem "remove left $(ls -d "$stale" "$root/run/gpushare" 2>/dev/null)"
[[ $(status_of) == "deinstall ok config-files $next" && ! -e $root/usr/bin/gpushared ]] && edited &&
    ok "remove: binaries gone, the edited policy file stays (status: config-files)" ||
    problem "after remove: status '$(status_of)', policy file $(edited && echo kept || echo lost)"
dpkg_root -P gpushare
[[ ! -e $root/etc/gpushare ]] && ok "purge: /etc/gpushare is gone" ||
    problem "purge left $(ls -A "$root/etc/gpushare")"
leftover=$(find "$root/etc/systemd" "$root/var/lib/systemd" -name 'gpushared*' 2>/dev/null || true)
[[ -z $leftover ]] && ok "purge: no unit state left" || problem "purge left $leftover"
grep -q '^gpushare:' "$root/etc/group" && ok "purge: the gpushare group stays (Debian practice)" ||
    problem "purge removed the gpushare group"

# ---------------------------------------------------------------------------------------
step "7. reproducible: package the same build again"
cp "$deb" "$work/first.deb"
again=$(./scripts/package.sh 2>/dev/null | tail -n 1)
cmp -s "$work/first.deb" "$again" && ok "identical: $(sha256sum "$again" | cut -c1-16)…" ||
    problem "a second packaging run gave a different .deb"

# ---------------------------------------------------------------------------------------
echo
if ((${#problems[@]})); then
    printf '\033[1;31mpackage-check FAILED\033[0m (%d problems, %ds):\n' "${#problems[@]}" $((SECONDS - started)) >&2
    printf '  - %s\n' "${problems[@]}" >&2
    exit 1
fi
printf '\033[1;32mpackage-check passed\033[0m in %ds: %s\n' $((SECONDS - started)) "$deb"
