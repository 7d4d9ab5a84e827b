// The package as it ships: the ES module build (dist/esm) and the CommonJS
// build (dist/cjs, marked as such by its own package.json), each with its
// declarations and maps, compiled from src/ by the pinned tsc. Run by `npm
// run build` and by `prepack`, so that `npm pack` and `npm publish` never
// ship a stale or missing build.
import { spawnSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const sdk = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(sdk, "node_modules", "typescript", "bin", "tsc");

rmSync(join(sdk, "dist"), { recursive: true, force: true });
for (const config of ["tsconfig.esm.json", "tsconfig.cjs.json"]) {
  const built = spawnSync(process.execPath, [tsc, "-p", join(sdk, config)], { stdio: "inherit" });
  if (built.status !== 0) process.exit(built.status ?? 1);
}
writeFileSync(join(sdk, "dist", "cjs", "package.json"), `${JSON.stringify({ type: "commonjs" })}\n`);
