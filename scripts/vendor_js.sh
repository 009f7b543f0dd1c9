#!/usr/bin/env bash
# Copy the page's third-party browser code from the npm registry into the package, so the
# page loads nothing from another origin (clusters are often offline) and the wheel ships it.
#
#   bash scripts/vendor_js.sh      # re-run after changing a version below; commit the result
#
# htmx stays on the 2.x line: 4.x rewrote the attribute semantics the page's forms rely on.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
static=$repo/slurmgen/coordinator/web/static
vendor=$static/vendor
packages=("htmx.org@2.0.11" "uplot@1.6.32")
# package path inside the tarball -> file name in static/vendor/
files=(
  "htmx.org package/dist/htmx.min.js htmx.min.js"
  "htmx.org package/LICENSE htmx.LICENSE"
  "uplot package/dist/uPlot.iife.min.js uPlot.iife.min.js"
  "uplot package/dist/uPlot.min.css uPlot.min.css"
  "uplot package/LICENSE uPlot.LICENSE"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$vendor"
(cd "$work" && npm pack --silent "${packages[@]}" >/dev/null)
for spec in "${packages[@]}"; do
  name=${spec%@*}
  mkdir -p "$work/$name"
  tar -xzf "$work/${name}-${spec##*@}.tgz" -C "$work/$name"
done
for entry in "${files[@]}"; do
  read -r name src dest <<<"$entry"
  cp "$work/$name/$src" "$vendor/$dest"
done
{
  echo "Third-party browser code, copied by scripts/vendor_js.sh from the npm registry."
  echo
  for spec in "${packages[@]}"; do
    name=${spec%@*}
    licence=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["license"])' "$work/$name/package/package.json")
    echo "- ${spec} (licence: ${licence})"
  done
} >"$vendor/VERSIONS.txt"
echo "vendor_js.sh: copied ${packages[*]} into ${vendor#"$repo"/}"
