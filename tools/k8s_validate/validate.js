// Validates Kubernetes objects against the API's OpenAPI schemas, through
// kubernetes-models (each kind's schema compiled with ajv), and the
// Prometheus operator's (monitoring.coreos.com: PodMonitor, PrometheusRule)
// through @kubernetes-models/prometheus-operator: types, required fields,
// enums, formats. It does not refuse fields the schema lacks (the
// API's schemas allow them; the server drops them), which the drift test's
// own checks cover for the fields asyncps relies on.
//
//   node validate.js FILE.json...   (each a JSON array of objects)
// Prints one line per object; exits 1 if any is invalid or of a kind it
// has no schema for.
"use strict";
const fs = require("fs");
const pathlib = require("path");

function modelFor(apiVersion, kind) {
  // "apps/v1" -> kubernetes-models/apps/v1/Kind; core "v1" -> v1/Kind;
  // the operator's group from its own package.
  const pkg = apiVersion.startsWith("monitoring.coreos.com/")
    ? "@kubernetes-models/prometheus-operator"
    : "kubernetes-models";
  try {
    return require(`${pkg}/${apiVersion}/${kind}`)[kind];
  } catch (e) {
    return null;
  }
}

let bad = 0;
for (const file of process.argv.slice(2)) {
  for (const obj of JSON.parse(fs.readFileSync(file, "utf8"))) {
    const name = `${pathlib.basename(file)}: ${obj.kind} ` +
      `${obj.metadata && obj.metadata.name}`;
    const Model = obj.apiVersion && obj.kind && modelFor(obj.apiVersion, obj.kind);
    if (!Model) {
      console.log(`INVALID ${name}: no schema for ${obj.apiVersion} ${obj.kind}`);
      bad++;
      continue;
    }
    try {
      new Model(obj).validate();
      console.log(`valid ${name}`);
    } catch (e) {
      console.log(`INVALID ${name}: ${e.message}`);
      bad++;
    }
  }
}
process.exit(bad > 0 ? 1 : 0);
