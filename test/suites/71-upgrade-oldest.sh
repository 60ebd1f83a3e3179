#!/usr/bin/env bash
# The upgrade suite from the oldest release (1.0), through every upgrade
# script to the newest: 70-upgrade covers the last release.
exec env IM_UPGRADE_FROM="$(grep -v '^#' "$(dirname "$0")/../upgrade/releases.txt" | head -n 1 | cut -d' ' -f1) " \
  bash "$(dirname "$0")/70-upgrade.sh"
