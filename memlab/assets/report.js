(function(){
const $ = id => document.getElementById(id);
let D;
try {
  D = JSON.parse($('memlab-data').textContent);
} catch (e) {  // a page cut short or edited by hand: say so instead of an empty browser
  const msg = `This report's embedded data could not be read (${e.message}), so the question browser is empty. ` +
    'Rebuild the page with memlab report --html.';
  document.body.insertAdjacentHTML('afterbegin', '<div class="data-error" role="alert" id="data-error"></div>');
  $('data-error').textContent = msg;
  if ($('detail')) $('detail').textContent = msg;
  return;
}
// The data comes packed (memlab.report_html.Tables): tables column by column, texts in one string table.
const S = D.strings;
function row(T, i){
  const o = {};
  for (const f in T) if (f !== 's') { const v = T[f][i]; o[f] = (v !== null && v !== undefined && T.s.includes(f)) ? S[v] : v; }
  return o;
}
const offsets = D.runs_data.map(R => {  // where each question's ops, queries and each query's hits start
  const op = [], query = [], hit = [];
  let a = 0, b = 0, c = 0;
  R.q.nops.forEach((n, i) => { op.push(a); a += n; query.push(b); b += R.q.nq[i]; });
  R.queries.nh.forEach(n => { hit.push(c); c += n; });
  return {op, query, hit};
});
D.questions = D.questions.qid.map((_, i) => {
  const q = row(D.questions, i);
  q.flip = !!q.flip;
  q.i = i;
  q.r = D.runs_data.map(R => {
    if (!R.q.has[i]) return null;
    const r = row(R.q, i);
    r.ok = !!r.ok;
    return r;
  });
  return q;
});
function layersOf(k, i){
  // One question's three layers in run k: the object memlab.report_html.layers() gives for it.
  const R = D.runs_data[k], o = offsets[k];
  const ops = [];
  for (let j = o.op[i]; j < o.op[i] + R.q.nops[i]; j++) ops.push(row(R.ops, R.opref[j]));
  const queries = [];
  for (let j = o.query[i]; j < o.query[i] + R.q.nq[i]; j++) {
    const q = row(R.queries, j), hits = [];
    for (let h = o.hit[j]; h < o.hit[j] + q.nh; h++) {
      const x = row(R.hits, h), m = row(D.mems, x.mem);
      hits.push({rank: x.rank === undefined ? h - o.hit[j] + 1 : x.rank, dense: x.dense, kw: x.kw, fused: x.fused, via: x.via, ev: !!x.ev, src: m.src, text: m.text});
    }
    delete q.nh;
    q.hits = hits;
    queries.push(q);
  }
  return {ops, queries, answer: row(R.answer, i)};
}
const esc = s => String(s === null || s === undefined ? '' : s).replace(/[&<>"]/g,
  c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const f3 = x => (x === null || x === undefined) ? 'n/a' : Number(x).toFixed(3);
D.runs.forEach((r, i) => $('f-run').insertAdjacentHTML('beforeend', `<option value="${i}">${esc(r.label)}</option>`));
D.cats.forEach(c => $('f-cat').insertAdjacentHTML('beforeend', `<option value="${c[0]}">${esc(c[1])}</option>`));
D.labels.forEach(l => $('f-label').insertAdjacentHTML('beforeend', `<option value="${l}">${esc(l)}</option>`));
$('qhead').innerHTML = '<tr><th>qid</th><th>cat</th><th>question</th>' +
  D.runs.map((r, i) => `<th title="${esc(r.label)}">F1 run ${i + 1}${i === 0 ? ' (A)' : ''}</th>`).join('') + '</tr>';
let selected = null;
function visible(){
  const run = +$('f-run').value, cat = $('f-cat').value, lab = $('f-label').value, out = $('f-outcome').value;
  const flip = $('f-flip').checked, text = $('f-text').value.toLowerCase();
  return D.questions.filter(q => {
    const r = q.r[run];
    if (cat && String(q.cat) !== cat) return false;
    if (flip && !q.flip) return false;
    if (lab && (!r || r.label !== lab)) return false;
    if (out === 'ok' && (!r || !r.ok)) return false;
    if (out === 'bad' && (!r || r.ok)) return false;
    if (text && !(q.q + ' ' + q.gold).toLowerCase().includes(text)) return false;
    return true;
  });
}
function render(){
  const qs = visible();
  $('f-count').textContent = `showing ${qs.length} of ${D.questions.length} questions`;
  $('qbody').innerHTML = qs.map(q => `<tr data-qid="${esc(q.qid)}" tabindex="0" aria-selected="${q.qid === selected}" ` +
    `class="${q.qid === selected ? 'sel' : ''}">` +
    `<td>${esc(q.qid)}${q.flip ? ' <span class="lab">flipped</span>' : ''}</td><td>${q.cat}</td><td>${esc(q.q)}</td>` +
    q.r.map(r => r ? `<td class="${r.ok ? 'ok' : 'bad'}">${f3(r.f1)}</td>` : '<td>-</td>').join('') + '</tr>').join('');
}
function layers(L){
  const ops = L.ops.length ? '<table><tr><th>op</th><th>result</th><th>reconcile</th><th>source</th><th>memory text</th></tr>' +
    L.ops.map(o => `<tr><td>${esc(o.action)}</td><td>${esc(o.result)}</td><td>${esc(o.tier || '')}` +
      `${o.score !== null && o.score !== undefined ? ' s=' + f3(o.score) : ''}${o.jaccard !== null && o.jaccard !== undefined ? ' J=' + f3(o.jaccard) : ''}</td>` +
      `<td>${esc(o.src)}</td><td>${esc(o.text)}${o.error ? ' <i>(' + esc(o.error) + ')</i>' : ''}</td></tr>`).join('') + '</table>'
    : '<p class="note">No extractor op touched the evidence turns: nothing was written from them.</p>';
  const qs = L.queries.length ? L.queries.map((q, i) => `<p><b>query ${i}</b>: ${esc(q.query)}` +
      `${q.dropped ? ` (dedupe dropped ${q.dropped})` : ''}${q.fallback ? ` (kind fallback added ${q.fallback})` : ''}` +
      `${q.error ? ' <i>error: ' + esc(q.error) + '</i>' : ''}</p>` +
      '<table><tr><th>#</th><th>dense</th><th>keyword</th><th>fused</th><th>via</th><th>source</th><th>memory</th></tr>' +
      q.hits.map(h => `<tr class="${h.ev ? 'ev' : ''}"><td>${h.rank}${h.ev ? '*' : ''}</td><td>${h.dense ?? ''}</td>` +
        `<td>${h.kw ?? ''}</td><td>${h.fused ?? ''}</td><td>${esc(h.via)}</td><td>${esc(h.src)}</td>` +
        `<td>${esc(h.text)}</td></tr>`).join('') + '</table>').join('') +
      '<p class="note">* highlighted: a memory sourced from an evidence turn.</p>'
    : '<p class="note">No retrieval (this arm reads without searching).</p>';
  const a = L.answer || {};
  const ans = `<p>rule: ${esc(a.rule)}; model calls ${a.calls ?? 0}; tokens prompt ${a.prompt_tokens ?? 0} / ` +
    `completion ${a.completion_tokens ?? 0}; latency ${a.latency !== null && a.latency !== undefined ? Number(a.latency).toFixed(4) + ' s' : 'n/a'}</p>` +
    (a.prompt ? `<details><summary>prompt</summary><pre>${esc(a.prompt)}</pre></details>` : '<p class="note">No prompt was sent (offline reader).</p>') +
    (a.response ? `<details><summary>response</summary><pre>${esc(a.response)}</pre></details>` : '') +
    (a.tools ? `<details><summary>tool calls</summary><pre>${esc(a.tools)}</pre></details>` : '');
  return `<div class="layer"><h4>1. extractor layer</h4>${ops}<h4>2. retrieval layer</h4>${qs}<h4>3. answer layer</h4>${ans}</div>`;
}
function show(qid, focus){
  selected = qid;
  const q = D.questions.find(x => x.qid === qid);
  let h = `<h3 id="d-title">${esc(q.qid)} &middot; ${esc(q.catName)}${q.flip ? ' <span class="lab">flipped</span>' : ''}</h3>` +
    `<p><b>Q:</b> ${esc(q.q)}<br><b>gold:</b> ${esc(q.gold)}<br><b>evidence:</b> ${esc(q.ev || '(none)')}</p>`;
  q.r.forEach((r, i) => {
    h += `<div class="runcol"><b>run ${i + 1}${i === 0 ? ' (A: deltas are run \u2212 A)' : ''}: ${esc(D.runs[i].label)}</b>`;
    if (!r) { h += '<p class="note">not answered in this run</p></div>'; return; }
    h += `<p>prediction: <b>${esc(r.pred)}</b> &mdash; F1 <span class="${r.ok ? 'ok' : 'bad'}">${f3(r.f1)}</span>` +
      `${r.label ? ` &mdash; <span class="lab">${esc(r.label)}</span> ${esc(r.reason)}` : ''}` +
      `${r.error ? ' <i>error: ' + esc(r.error) + '</i>' : ''}</p>` + layers(layersOf(i, q.i)) + '</div>';
  });
  $('detail').innerHTML = h;
  render();
  const tr = [...$('qbody').rows].find(t => t.dataset.qid === qid);  // keep the keyboard where it was
  if (tr && focus) tr.focus();
}
['f-run', 'f-cat', 'f-label', 'f-outcome', 'f-flip'].forEach(id => $(id).addEventListener('change', render));
$('f-text').addEventListener('input', render);
$('qbody').addEventListener('click', e => { const tr = e.target.closest('tr'); if (tr) show(tr.dataset.qid); });
$('qbody').addEventListener('keydown', e => {  // rows are reachable by Tab; Enter or Space opens, arrows move
  const tr = e.target.closest('tr');
  if (!tr) return;
  if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); show(tr.dataset.qid, true); }
  const next = e.key === 'ArrowDown' ? tr.nextElementSibling : e.key === 'ArrowUp' ? tr.previousElementSibling : null;
  if (next) { e.preventDefault(); next.focus(); }
});
render();
window.memlabReport = {show, render, visible, layersOf, questions: D.questions};
})();
