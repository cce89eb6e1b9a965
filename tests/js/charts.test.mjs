// Unit tests of the chart axes (ui/static/charts.js), run by Node's own test runner through
// tests/test_ui_js.py. The cases are the ones issue 48 found wrong on a real run's pages.
// charts.js is a browser module (a plain .js beside no package.json): it is loaded from its
// source as a data: URL, which Node imports as an ES module whatever its version's defaults.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const source = process.env.AWM_CHARTS_JS || new URL("../../ui/static/charts.js", import.meta.url);
const { niceTicks, tickLabel, decimalsOf } = await import(
  `data:text/javascript;base64,${Buffer.from(readFileSync(source)).toString("base64")}`);

const labels = (lo, hi, count) => {
  const nice = niceTicks(lo, hi, count);
  return nice.ticks.map((v) => tickLabel(v, nice.step));
};

test("a 0-1 panel reads 0.25 as 0.25, not 0.3", () => {
  assert.deepEqual(labels(0, 1, 4), ["0.00", "0.25", "0.50", "0.75", "1.00"]);
});

test("a tick at zero is zero, never -7e-18", () => {
  for (const [lo, hi, count] of [[-0.7, 0.7, 4], [-0.3, 0.9, 4], [-0.6, 0.2, 5], [-1.3, 0.45, 6], [-0.07, 0.03, 4]]) {
    const nice = niceTicks(lo, hi, count);
    assert.ok(nice.ticks.some((v) => Object.is(v, 0)), `${lo}..${hi}: ${nice.ticks}`);
    const zero = tickLabel(0, nice.step);
    assert.match(zero, /^0(\.0+)?$/);
    assert.ok(!labels(lo, hi, count).some((l) => /e-/.test(l)), `${lo}..${hi}: ${labels(lo, hi, count)}`);
  }
});

test("a log axis' powers of ten read 10 and 100, not 10.00 and 100.00", () => {
  assert.deepEqual([0.001, 0.01, 0.1, 1, 10, 100, 1e4, 1e6].map((v) => tickLabel(v)),
    ["0.001", "0.01", "0.1", "1", "10", "100", "10k", "1M"]);
  assert.equal(tickLabel(1e-7), "1e-7");
});

test("every label says its tick's value exactly, and no two ticks read alike", () => {
  const ranges = [[0, 1], [0, 0.3], [0.2, 0.45], [-2.5, 7.5], [0, 37], [1, 3], [0.0001, 0.0009], [-5e-8, 2e-7],
    [0, 12500], [980, 1020], [0, 2.5e6], [3, 3], [0, 0]];
  for (const [lo, hi] of ranges) {
    for (const count of [4, 5, 6]) {
      const nice = niceTicks(lo, hi, count);
      const shown = nice.ticks.map((v) => tickLabel(v, nice.step));
      assert.equal(new Set(shown).size, shown.length, `${lo}..${hi}/${count}: ${shown}`);
      nice.ticks.forEach((v, i) => {
        const text = shown[i];
        const value = text.endsWith("M") ? parseFloat(text) * 1e6 : text.endsWith("k") ? parseFloat(text) * 1e3 : Number(text);
        assert.ok(Math.abs(value - v) <= nice.step * 1e-6, `${lo}..${hi}/${count}: ${v} shown as ${text}`);
      });
      assert.ok(nice.lo <= lo && nice.hi >= hi, `${lo}..${hi}: the ticks cover the values`);
    }
  }
});

test("the decimals of a step", () => {
  assert.deepEqual([5, 0.5, 0.25, 2.5, 0.1 + 0.2, 1e-7, 1e-3].map(decimalsOf), [0, 1, 2, 1, 1, 7, 3]);
});
