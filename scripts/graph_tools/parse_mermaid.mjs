// Parses a mermaid diagram from stdin with mermaid's own parser and prints what it understood, as JSON:
// {"ok": true, "type", "vertices": [{id, text, classes}], "edges": [{start, end, text, stroke}],
//  "subgraphs": [{id, title, nodes}]}, or {"ok": false, "error"} (exit 1). Text is as mermaid keeps it
// (entity codes such as #34; become "\ufb02\u00b0\u00b034\u00b6\u00df" until it draws them).
import { JSDOM } from "jsdom";
import fs from "node:fs";

const dom = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true });
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false, securityLevel: "strict" });
const text = fs.readFileSync(0, "utf8");
try {
  const diagram = await mermaid.mermaidAPI.getDiagramFromText(text);
  const db = diagram.db;
  const out = { ok: true, type: diagram.type };
  if (db.getVertices) {
    out.vertices = [...db.getVertices().values()].map((v) => ({ id: v.id, text: v.text, classes: v.classes }));
    out.edges = db.getEdges().map((e) => ({ start: e.start, end: e.end, text: e.text, stroke: e.stroke }));
    out.subgraphs = db.getSubGraphs().map((g) => ({ id: g.id, title: g.title, nodes: g.nodes }));
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ ok: false, error: String((e && e.message) || e) }));
  process.exitCode = 1;
}
