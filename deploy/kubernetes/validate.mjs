// Validates Kubernetes objects against the API's JSON schemas with the
// npm package kubernetes-models (validate() throws on the first error).
// Input on stdin: a JSON array of [file, object] pairs (check.py converts
// the YAML). Usage: node validate.mjs NODE_MODULES_DIR < objects.json
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import path from "node:path";

const root = process.argv[2];
if (!root) {
  console.error("usage: node validate.mjs NODE_MODULES_DIR < objects.json");
  process.exit(2);
}
const objs = JSON.parse(readFileSync(0, "utf8"));
let bad = 0;
for (const [file, obj] of objs) {
  const [group, version] = obj.apiVersion.includes("/")
    ? obj.apiVersion.split("/")
    : [null, obj.apiVersion];
  const dir = group ? `${group}/${version}` : version;
  const mod = path.join(root, "kubernetes-models", dir, `${obj.kind}.js`);
  const what = `${file}: ${obj.kind} ${obj.metadata?.name}`;
  try {
    const m = await import(pathToFileURL(mod).href);
    const Cls = m[obj.kind] ?? m.default;
    new Cls(obj).validate();
    console.log(`ok ${what}`);
  } catch (e) {
    bad++;
    console.log(`INVALID ${what}: ${e.message.split("\n").slice(0, 8).join(" | ")}`);
  }
}
process.exit(bad ? 1 : 0);
