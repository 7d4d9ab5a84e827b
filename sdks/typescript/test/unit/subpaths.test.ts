/**
 * The framework integrations as the package ships them: `@charter/sdk/ai-sdk`
 * and `@charter/sdk/openai-agents` resolve through `exports` (the package
 * referring to itself) to the built ES module and CommonJS copies, each with
 * what the docs name.
 */

import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { test } from "node:test";

const require = createRequire(import.meta.url);

test("X1_the_ai_sdk_and_openai_agents_subpaths_load_as_ES_modules_and_through_require", async () => {
  const esmAi = await import("@charter/sdk/ai-sdk");
  const cjsAi = require("@charter/sdk/ai-sdk") as typeof esmAi;
  for (const loaded of [esmAi, cjsAi]) {
    for (const name of ["charterMiddleware", "charterModel", "charterTools", "toolCalls", "modelCalls", "currentSend"] as const) {
      assert.equal(typeof loaded[name], "function", `ai-sdk exports ${name}`);
    }
  }
  const esmAgents = await import("@charter/sdk/openai-agents");
  const cjsAgents = require("@charter/sdk/openai-agents") as typeof esmAgents;
  for (const loaded of [esmAgents, cjsAgents]) {
    for (const name of ["charterTool", "charterModels", "inNode", "toolCalls", "stoppedBy", "currentSend"] as const) {
      assert.equal(typeof loaded[name], "function", `openai-agents exports ${name}`);
    }
  }
  assert.notEqual(esmAi.ToolCalls, cjsAi.ToolCalls, "two copies, as the package ships them");
});
