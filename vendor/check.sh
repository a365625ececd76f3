#!/usr/bin/env bash
# Fails unless each vendor/<crate> is exactly the crate published on crates.io (less the files
# vendor/rebuild.sh leaves out) with vendor/patches/<crate>-<version>.patch applied, and every
# hunk of that patch carries the `konnectivity-server patch` marker. Run by .ci/run.
exec "$(dirname "${BASH_SOURCE[0]}")/rebuild.sh" --check "$@"
