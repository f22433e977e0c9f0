// The jsonl2html page: builds a group's rollouts when it is first opened, sorts and filters
// the groups by score, and moves through them with the keyboard.
(() => {
  'use strict';
  const container = document.getElementById('groups-container');
  const groups = Array.from(container.querySelectorAll('details.group'));
  const byId = (id) => document.getElementById(id);
  const controls = {
    form: byId('controls'), key: byId('sort-key'), order: byId('sort-order'), stat: byId('filter-stat'),
    low: byId('filter-low'), high: byId('filter-high'), differing: byId('only-differing'), count: byId('shown-count'),
  };
  // The rollouts of group i, cut out of the inert block (one string per group) on first need.
  let bodies = null;
  // The groups that pass the filter, in display order: what the keys move through.
  let shown = groups;
  let active = null;  // the selected rollout
  let current = null;  // the group the keys act on

  function fill(group) {
    const content = group.querySelector('.group-content');
    if (content.childElementCount) return;
    if (bodies === null) bodies = byId('group-bodies').text.split('\u001e');
    content.innerHTML = bodies[Number(group.dataset.index)];
  }

  function itemsOf(group) {
    fill(group);
    return Array.from(group.querySelectorAll('.item'));
  }

  function setCurrent(group) {
    if (current) current.classList.remove('current');
    current = group;
    if (group) group.classList.add('current');
  }

  function deactivate() {
    if (active) active.classList.remove('active');
    active = null;
  }

  function activate(item) {
    deactivate();
    active = item;
    item.classList.add('active');
    const group = item.closest('details.group');
    fill(group);
    group.open = true;
    setCurrent(group);
    item.tabIndex = -1;
    item.focus({ preventScroll: true });
    item.scrollIntoView({ block: 'nearest' });
  }

  // ArrowDown/ArrowUp: the next or previous rollout, into the next or previous shown group
  // at the end of one; from nothing selected, the first (or last) rollout.
  function moveRollout(delta) {
    const group = active ? active.closest('details.group') : current;
    let position = group ? shown.indexOf(group) : -1;
    if (position >= 0) {
      const items = itemsOf(group);
      const next = active ? items.indexOf(active) + delta : (delta > 0 ? 0 : items.length - 1);
      if (next >= 0 && next < items.length) return activate(items[next]);
      position += delta;
    } else {
      position = delta > 0 ? 0 : shown.length - 1;
    }
    if (position < 0 || position >= shown.length) return;
    const items = itemsOf(shown[position]);
    if (items.length) activate(items[delta > 0 ? 0 : items.length - 1]);
  }

  // j/k (n/p): the next or previous shown group, focused on its summary line.
  function moveGroup(delta) {
    if (!shown.length) return;
    const position = current ? shown.indexOf(current) : -1;
    const next = position < 0 ? (delta > 0 ? 0 : shown.length - 1)
      : Math.min(Math.max(position + delta, 0), shown.length - 1);
    deactivate();
    setCurrent(shown[next]);
    shown[next].querySelector('summary').focus({ preventScroll: true });
    shown[next].scrollIntoView({ block: 'nearest' });
  }

  function toggle(group) {
    if (!group.open) fill(group);
    group.open = !group.open;
    if (!group.open) {
      deactivate();
      group.querySelector('summary').focus({ preventScroll: true });
    }
  }

  document.addEventListener('keydown', (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.target.closest('#controls')) return;
    const keys = { ArrowDown: () => moveRollout(1), ArrowUp: () => moveRollout(-1), j: () => moveGroup(1),
      n: () => moveGroup(1), k: () => moveGroup(-1), p: () => moveGroup(-1) };
    if (keys[event.key]) {
      event.preventDefault();
      keys[event.key]();
    } else if (event.key === 'Enter' && current && !event.target.closest('summary, a')) {
      // On a summary, Enter already toggles its group (and the click handler fills it).
      event.preventDefault();
      toggle(current);
    }
  });

  // A click on a summary lands before the group opens: fill it first, so it opens full.
  container.addEventListener('click', (event) => {
    const summary = event.target.closest('summary');
    if (summary) return fill(summary.parentElement);
    const item = event.target.closest('.item');
    if (item && !event.target.closest('a')) activate(item);
  });
  // Opened some other way (by a script, say): fill it too. `toggle` does not bubble.
  container.addEventListener('toggle', (event) => { if (event.target.open) fill(event.target); }, true);
  container.addEventListener('focusin', (event) => {
    const group = event.target.closest('details.group');
    if (group && group !== current) {
      // Moving to another group (a click or Tab on its summary): the keys go on from there.
      if (active && !group.contains(active)) deactivate();
      setCurrent(group);
    }
  });

  const number = (value) => (value === undefined || value === '' ? NaN : Number(value));
  const entries = groups.map((el) => ({
    el, index: Number(el.dataset.index), min: number(el.dataset.min), mean: number(el.dataset.mean),
    max: number(el.dataset.max), spread: number(el.dataset.spread),
  }));
  let order = 'index 1';  // as written: the file's order

  function apply() {
    const key = controls.key.value;
    const sign = controls.order.value === 'desc' ? -1 : 1;
    if (groups.length && order !== `${key} ${sign}`) {
      order = `${key} ${sign}`;
      // Groups without numeric scores go last whichever the direction; ties keep file order.
      entries.sort((a, b) => {
        const missing = Number.isNaN(a[key]) - Number.isNaN(b[key]);
        return missing || (a[key] - b[key]) * sign || a.index - b.index;
      });
      // Emptied first: moving nodes one by one out of a long list takes time quadratic in it.
      container.textContent = '';
      const fragment = document.createDocumentFragment();
      for (const entry of entries) fragment.append(entry.el);
      container.append(fragment);
    }
    const stat = controls.stat.value;
    const low = number(controls.low.value);
    const high = number(controls.high.value);
    const differing = controls.differing.checked;
    const visible = (entry) => (!differing || entry.spread > 0)
      && (Number.isNaN(low) || entry[stat] >= low) && (Number.isNaN(high) || entry[stat] <= high);
    shown = [];
    for (const entry of entries) {
      const hide = !visible(entry);
      // Written only on change: each write restyles the group, and there may be 10,000.
      if (entry.el.hidden !== hide) entry.el.hidden = hide;
      if (!hide) shown.push(entry.el);
    }
    if (current && current.hidden) {
      deactivate();
      setCurrent(null);
    }
    const count = (n) => n.toLocaleString('en');
    controls.count.textContent = `${count(shown.length)} of ${count(groups.length)} groups shown`;
  }

  controls.form.addEventListener('submit', (event) => event.preventDefault());
  controls.form.addEventListener('input', apply);
  apply();
  document.body.dataset.ready = '1';
})();
