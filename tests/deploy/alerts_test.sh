#!/usr/bin/env bash
# deploy/alerts.yml against its unit tests (deploy/alerts_test.yml) with
# Debian's promtool: every rule fires on the series that should fire it and
# stays quiet on those that should not.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
work="$TEST_TMPDIR/alerts"
mkdir -p "$work"
cp "$root/deploy/alerts.yml" "$root/deploy/alerts_test.yml" "$work/"
promtool check rules "$work/alerts.yml"
promtool test rules "$work/alerts_test.yml"
