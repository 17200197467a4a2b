// Validates rendered Kubernetes objects offline.
//
//   node check_objects.mjs rendered.yaml types.ts
//
// 1. Every object validates against the Kubernetes OpenAPI schemas (the
//    kubernetes-models class of its apiVersion and kind): required fields,
//    types, formats, enums.
// 2. Writes `types.ts`, which assigns every object, as an object literal, to
//    its kubernetes-types type; `tsc --noEmit` on it then rejects unknown
//    fields (TypeScript's excess property check), which the schemas allow.
// Exit status: 0 when every object validates, 1 otherwise (each problem is
// printed as "Kind/name: ..."), 2 on usage or YAML errors.
import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const [input, tsOut] = process.argv.slice(2);
if (!input || !tsOut) {
  console.error("usage: node check_objects.mjs rendered.yaml types.ts");
  process.exit(2);
}

const docs = parseAllDocuments(readFileSync(input, "utf8"));
const objects = [];
for (const doc of docs) {
  if (doc.errors.length > 0) {
    console.error(`${input}: ${doc.errors.map((e) => e.message).join("; ")}`);
    process.exit(2);
  }
  const o = doc.toJS();
  if (o !== null && o !== undefined) objects.push(o);
}
if (objects.length === 0) {
  console.error(`${input}: no objects`);
  process.exit(2);
}

// "apps/v1" -> kubernetes-types/apps/v1; "v1" -> core/v1;
// "networking.k8s.io/v1" -> networking/v1.
function typesModule(apiVersion) {
  const [group, version] = apiVersion.includes("/")
    ? apiVersion.split("/")
    : ["core", apiVersion];
  return `kubernetes-types/${group.split(".")[0]}/${version}`;
}

const problems = [];
const imports = new Map();
const declarations = [];
for (const [i, o] of objects.entries()) {
  const name = `${o.kind ?? "?"}/${o.metadata?.name ?? "?"}`;
  if (typeof o.apiVersion !== "string" || typeof o.kind !== "string") {
    problems.push(`${name}: apiVersion and kind are required`);
    continue;
  }
  let model;
  try {
    model = (await import(`kubernetes-models/${o.apiVersion}`))[o.kind];
  } catch {
    model = undefined;
  }
  if (typeof model !== "function") {
    problems.push(`${name}: unknown apiVersion/kind ${o.apiVersion} ${o.kind}`);
    continue;
  }
  try {
    new model(o).validate();
  } catch (e) {
    problems.push(`${name}: ${e.message}`);
  }
  const module = typesModule(o.apiVersion);
  if (!imports.has(module)) imports.set(module, `T${imports.size}`);
  declarations.push(
    `// ${name}\nexport const object${i}: ${imports.get(module)}.${o.kind} = ` +
      `${JSON.stringify(o, null, 2)};\n`,
  );
}

const header = [...imports]
  .map(([module, alias]) => `import type * as ${alias} from "${module}";`)
  .join("\n");
writeFileSync(tsOut, `// Generated from ${input}.\n${header}\n\n${declarations.join("\n")}`);

for (const p of problems) console.error(p);
console.log(`${objects.length} objects, ${problems.length} schema problems`);
process.exit(problems.length === 0 ? 0 : 1);
