# Reads `cargo test` output and prints one line: how many tests passed, failed and were
# skipped over all test binaries, naming the failed ones and why each skipped one skipped.
# A skipped test passes in cargo's count (it prints `SKIPPED <what>: <why>` on stderr and
# returns), so it is taken out of the passed ones; #[ignore]d tests count as skipped too.
# Used by scripts/test.sh: awk -f scripts/test-summary.awk cargo-test.log

function binary_name(line,    name) {
    if (line ~ /Doc-tests /) {
        name = line
        sub(/.*Doc-tests /, "", name)
        return "doc-tests " name
    }
    # "Running tests.rs (target/debug/deps/name-0123abcd)": the file name without its hash.
    name = line
    sub(/.*\//, "", name)
    sub(/\)$/, "", name)
    sub(/-[0-9a-f]+$/, "", name)
    return name
}

/^ *(Running|Doc-tests) / {
    current = binary_name($0)
    binaries++
    next
}

function note_skip(what) {
    skipped++
    # Most skip messages start with the binary's name already.
    if (index(what, current ":") != 1 && index(what, current " ") != 1) what = current ": " what
    skips = skips (skips == "" ? "" : "; ") what
}

/SKIPPED/ {
    what = $0
    sub(/.*SKIPPED:? */, "", what)
    note_skip(what)
    skipped_passes++
}

/^test .* \.\.\. ignored/ {
    note_skip($2 " (ignored)")
}

/^test .* \.\.\. FAILED/ {
    failures = failures (failures == "" ? "" : ", ") current "::" $2
}

/^test result: / {
    for (i = 1; i <= NF; i++) {
        if ($(i + 1) ~ /^passed;?$/) passed += $i
        if ($(i + 1) ~ /^failed;?$/) failed += $i
    }
}

END {
    passed -= skipped_passes
    if (passed < 0) passed = 0
    line = sprintf("%d passed, %d failed, %d skipped over %d test binar%s", passed, failed, skipped, binaries, binaries == 1 ? "y" : "ies")
    if (failures != "") line = line " — failed: " failures
    if (skips != "") line = line " — skipped: " skips
    print line
}
