#!/usr/bin/env bash
# Type-checks the dashboards against Grafana's own dashboard schema: the `Dashboard` type of the
# npm package @grafana/schema (the classic JSON model Grafana provisions), with TypeScript's strict
# excess-property checks, so an unknown, misspelled or missing field fails. Needs node and npm; not
# part of `make test` (it installs two npm packages into a temporary directory).
#
#   deploy/grafana/check_schema.sh            # @grafana/schema 13.2.3
#   GRAFANA_SCHEMA=12.4.0 deploy/grafana/check_schema.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --silent --no-audit --no-fund "@grafana/schema@${GRAFANA_SCHEMA:-13.2.3}" typescript@5 >/dev/null
for f in "$here"/dashboards/*.json; do
  name="$(basename "$f" .json | tr - _)"
  {
    echo "import { ThresholdsMode, type Dashboard } from '@grafana/schema';"
    echo -n "export const ${name}: Dashboard = "
    # A TypeScript string enum does not accept its plain string value; the JSON value is the same.
    sed 's/"mode": "absolute"/"mode": ThresholdsMode.Absolute/' "$f"
    echo ";"
  } > "check_${name}.ts"
done
cat > tsconfig.json <<'JSON'
{"compilerOptions": {"strict": true, "noEmit": true, "module": "esnext", "moduleResolution": "bundler",
  "target": "es2022", "skipLibCheck": true}, "include": ["check_*.ts"]}
JSON
npx tsc -p . && echo "dashboards conform to @grafana/schema ${GRAFANA_SCHEMA:-13.2.3}"
