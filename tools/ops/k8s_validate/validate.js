// Validates Kubernetes objects against the API's OpenAPI schemas, through
// kubernetes-models (each kind's schema compiled with ajv), and the
// Prometheus operator's (monitoring.coreos.com: PodMonitor, PrometheusRule)
// through @kubernetes-models/prometheus-operator: types, required fields,
// enums, formats. The API's schemas allow fields they do not name (the
// server drops them, so a misspelt field is silently lost), so a second
// pass refuses those: every object, as a TypeScript literal typed with the
// same models' interfaces (IJob, IPodMonitor, ...), through the TypeScript
// compiler's excess-property check ("Object literal may only specify known
// properties"; it names one such field per object a run).
//
//   node validate.js FILE.json...   (each a JSON array of objects)
// Prints one line per object; exits 1 if any is invalid, has a field its
// type lacks, or is of a kind it has no schema for.
"use strict";
const fs = require("fs");
const pathlib = require("path");

const os = require("os");
const ts = require("typescript");

// "apps/v1" -> kubernetes-models/apps/v1/Kind; core "v1" -> v1/Kind; the
// operator's group from its own package.
function modulePath(apiVersion, kind) {
  const pkg = apiVersion.startsWith("monitoring.coreos.com/")
    ? "@kubernetes-models/prometheus-operator"
    : "kubernetes-models";
  return `${pkg}/${apiVersion}/${kind}`;
}

function modelFor(apiVersion, kind) {
  try {
    return require(modulePath(apiVersion, kind))[kind];
  } catch (e) {
    return null;
  }
}

// The fields each object has that its type lacks, by object index:
// one TypeScript file holding every object as a typed literal.
function unknownFields(objects) {
  const dir = fs.mkdtempSync(pathlib.join(os.tmpdir(), "k8s-validate-"));
  const file = pathlib.join(dir, "objects.ts");
  const lines = [];
  const spans = [];  // [first line, last line] of each object's literal.
  objects.forEach((obj, i) => {
    lines.push(`import { I${obj.kind} as T${i} } from ` +
      `${JSON.stringify(modulePath(obj.apiVersion, obj.kind))};`);
  });
  objects.forEach((obj, i) => {
    const text = JSON.stringify(obj, null, 1).split("\n");
    spans.push([lines.length, lines.length + text.length - 1]);
    text[0] = `export const o${i}: T${i} = ${text[0]}`;
    lines.push(...text);
  });
  fs.writeFileSync(file, lines.join("\n") + ";\n");
  const nodePath = (process.env.NODE_PATH || "").split(":").filter(Boolean);
  const program = ts.createProgram([file], {
    strict: true, noEmit: true, skipLibCheck: true, types: [],
    moduleResolution: ts.ModuleResolutionKind.Node10,
    baseUrl: "/", paths: { "*": nodePath.map((p) => `${p}/*`) },
  });
  const found = objects.map(() => []);
  for (const d of ts.getPreEmitDiagnostics(program)) {
    // The literal's keys are JSON's quoted ones: '"name"' reads 'name'.
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ")
      .replace(/'"([^"']*)"'/g, "'$1'");
    const line = d.file && d.file.fileName === file
      ? d.file.getLineAndCharacterOfPosition(d.start).line : -1;
    const at = spans.findIndex(([a, b]) => line >= a && line <= b);
    // Anything else (a type that cannot be found, a compiler error) would
    // leave the objects unchecked: it fails them all.
    if (at >= 0) {
      found[at].push(message);
    } else {
      found.forEach((f) => f.push(message));
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
  return found;
}

// Every file's objects, checked together (one TypeScript program).
let bad = 0;
const known = [];
const verdicts = [];
for (const file of process.argv.slice(2)) {
  for (const obj of JSON.parse(fs.readFileSync(file, "utf8"))) {
    const name = `${pathlib.basename(file)}: ${obj.kind} ` +
      `${obj.metadata && obj.metadata.name}`;
    const Model = obj.apiVersion && obj.kind &&
      modelFor(obj.apiVersion, obj.kind);
    if (!Model) {
      verdicts.push({ name, error: `no schema for ${obj.apiVersion} ${obj.kind}` });
      continue;
    }
    known.push(obj);
    try {
      new Model(obj).validate();
      verdicts.push({ name, obj });
    } catch (e) {
      verdicts.push({ name, obj, error: e.message });
    }
  }
}
const strict = unknownFields(known);
for (const v of verdicts) {
  const extra = v.obj ? strict[known.indexOf(v.obj)] : [];
  const errors = [v.error, ...extra].filter(Boolean);
  if (errors.length === 0) {
    console.log(`valid ${v.name}`);
  } else {
    console.log(`INVALID ${v.name}: ${errors.join("; ")}`);
    bad++;
  }
}
process.exit(bad > 0 ? 1 : 0);
