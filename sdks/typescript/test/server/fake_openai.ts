/**
 * A model on loopback that speaks OpenAI's Chat Completions wire format
 * (`POST /v1/chat/completions`, a JSON answer or, with `stream: true`, its
 * server-sent chunks), for the frameworks' own OpenAI clients: the AI SDK's
 * `@ai-sdk/openai` and the Agents SDK's `openai`. Each conversation follows a
 * script, found by a marker in its first user message: step N answers the
 * request that carries N assistant messages, with a tool call (a fresh
 * `call_...` id each time, as a real model's) or a text. Every request is
 * kept with what it was billed, so a test can say what the model was asked,
 * told and billed.
 */

import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server } from "node:http";

export type Step = { tool: string; arguments: Record<string, unknown> } | { text: string };

export interface Billed {
  marker: string;
  step: number;
  inputTokens: number;
  outputTokens: number;
  idempotencyKey: string | undefined;
  /** The tool results the model was told in this request, in order. */
  told: string[];
}

interface Message {
  role: string;
  content?: unknown;
}

export class FakeOpenAI {
  readonly billed: Billed[] = [];
  readonly #scripts = new Map<string, Step[]>();
  readonly #server: Server;
  url = "";

  constructor() {
    this.#server = createServer((request, response) => {
      this.#answer(request).then(
        ({ status, body, stream }) => {
          if (stream !== undefined) {
            response.writeHead(200, { "content-type": "text/event-stream" });
            for (const chunk of stream) response.write(`data: ${JSON.stringify(chunk)}\n\n`);
            response.end("data: [DONE]\n\n");
            return;
          }
          response.writeHead(status, { "content-type": "application/json" });
          response.end(JSON.stringify(body));
        },
        (error: unknown) => {
          response.writeHead(500, { "content-type": "application/json" });
          response.end(JSON.stringify({ error: { message: String(error) } }));
        },
      );
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((done) => this.#server.listen(0, "127.0.0.1", done));
    const address = this.#server.address();
    this.url = `http://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}/v1`;
    return this;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise((done) => this.#server.close(done));
  }

  /** The script of the conversation whose first user message contains `marker`. */
  script(marker: string, steps: Step[]): void {
    this.#scripts.set(marker, steps);
  }

  /** What the conversation with `marker` was billed, request by request. */
  of(marker: string): Billed[] {
    return this.billed.filter((b) => b.marker === marker);
  }

  async #answer(request: IncomingMessage): Promise<{ status: number; body?: unknown; stream?: unknown[] }> {
    if (request.method !== "POST" || !request.url?.endsWith("/chat/completions")) {
      return { status: 404, body: { error: { message: `no ${request.method} ${request.url} here` } } };
    }
    let text = "";
    for await (const chunk of request) text += String(chunk);
    const asked = JSON.parse(text) as { model: string; messages: Message[]; stream?: boolean };
    const first = asked.messages.find((m) => m.role === "user");
    const said = typeof first?.content === "string" ? first.content : JSON.stringify(first?.content ?? "");
    const marker = [...this.#scripts.keys()].find((m) => said.includes(m));
    if (marker === undefined) return { status: 400, body: { error: { message: "no script for this conversation" } } };
    const step = asked.messages.filter((m) => m.role === "assistant").length;
    const next = this.#scripts.get(marker)![step] ?? { text: "done" };
    const inputTokens = Math.ceil(text.length / 4);
    const outputTokens = "tool" in next ? 20 : 10;
    const told = asked.messages.filter((m) => m.role === "tool").map((m) => String(m.content));
    const key = request.headers["idempotency-key"];
    this.billed.push({ marker, step, inputTokens, outputTokens, idempotencyKey: Array.isArray(key) ? key[0] : key, told });
    const usage = { prompt_tokens: inputTokens, completion_tokens: outputTokens, total_tokens: inputTokens + outputTokens };
    const id = `chatcmpl-${randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const call = "tool" in next ? { id: `call_${randomUUID().replaceAll("-", "")}`, type: "function", function: { name: next.tool, arguments: JSON.stringify(next.arguments) } } : undefined;
    const finish = call === undefined ? "stop" : "tool_calls";
    if (asked.stream === true) {
      const base = { id, object: "chat.completion.chunk", created, model: asked.model };
      const delta = call === undefined ? { role: "assistant", content: (next as { text: string }).text } : { role: "assistant", tool_calls: [{ index: 0, ...call }] };
      return {
        status: 200,
        stream: [
          { ...base, choices: [{ index: 0, delta, finish_reason: null }] },
          { ...base, choices: [{ index: 0, delta: {}, finish_reason: finish }] },
          { ...base, choices: [], usage },
        ],
      };
    }
    const message = call === undefined ? { role: "assistant", content: (next as { text: string }).text } : { role: "assistant", content: null, tool_calls: [call] };
    return {
      status: 200,
      body: { id, object: "chat.completion", created, model: asked.model, choices: [{ index: 0, message, finish_reason: finish }], usage },
    };
  }
}
