/*
 * kvferry's chart script, embedded in the pages `kvferry calc --html` and
 * `kvferry report` write: line charts (linear or log axes, markers,
 * vertical marks) and horizontal grouped bar charts, drawn as inline SVG
 * with no library and no network. Every drawn value also sits in the DOM
 * (data-x / data-y / data-value attributes and <title> tooltips), so a
 * headless browser's DOM dump can be checked against the data.
 */
var KvfChart = (function () {
  'use strict';
  var NS = 'http://www.w3.org/2000/svg';

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    var k;
    for (k in attrs) {
      if (Object.prototype.hasOwnProperty.call(attrs, k) &&
          attrs[k] !== undefined && attrs[k] !== null) {
        e.setAttribute(k, String(attrs[k]));
      }
    }
    if (text !== undefined) {
      e.textContent = text;
    }
    if (parent) {
      parent.appendChild(e);
    }
    return e;
  }

  /* 3 significant digits, k/M/G/T suffixes (decimal). */
  function fmtNum(v) {
    var a = Math.abs(v);
    var units = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
    var i;
    if (!isFinite(v)) {
      return String(v);
    }
    if (a === 0) {
      return '0';
    }
    for (i = 0; i < units.length; i++) {
      if (a >= units[i][0]) {
        return +(v / units[i][0]).toPrecision(3) + units[i][1];
      }
    }
    return String(+v.toPrecision(3));
  }

  /* Binary sizes: 8K, 64M, 1G. */
  function fmtBytes(v) {
    var units = ['', 'K', 'M', 'G', 'T'];
    var u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return +v.toPrecision(3) + units[u];
  }

  function fmtSeconds(s) {
    if (s >= 1) {
      return +s.toPrecision(3) + ' s';
    }
    if (s >= 1e-3) {
      return +(s * 1e3).toPrecision(3) + ' ms';
    }
    return +(s * 1e6).toPrecision(3) + ' µs';
  }

  function niceStep(span, count) {
    var raw = span / Math.max(1, count);
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  }

  /* An axis: domain, scale to [r0, r1], ticks. */
  function axis(lo, hi, log, base2, r0, r1) {
    var a = {log: log};
    var ticks = [];
    var v, e, step, stride, m;
    if (!(hi > lo)) {
      hi = lo > 0 ? lo * 2 : lo + 1;
      if (!log && lo === 0) {
        hi = 1;
      }
    }
    if (log) {
      var b = base2 ? 2 : 10;
      var e0 = Math.floor(Math.log(lo) / Math.log(b) + 1e-9);
      var e1 = Math.ceil(Math.log(hi) / Math.log(b) - 1e-9);
      if (e1 <= e0) {
        e1 = e0 + 1;
      }
      lo = Math.pow(b, e0);
      hi = Math.pow(b, e1);
      stride = Math.max(1, Math.ceil((e1 - e0) / 10));
      for (e = e0; e <= e1; e += stride) {
        ticks.push(Math.pow(b, e));
      }
      if (!base2 && e1 - e0 <= 2) {
        for (e = e0; e < e1; e++) {
          [2, 5].forEach(function (k) {
            ticks.push(k * Math.pow(10, e));
          });
        }
        ticks.sort(function (x, y) { return x - y; });
      }
      m = function (x) {
        return r0 + (Math.log(x) - Math.log(lo)) /
               (Math.log(hi) - Math.log(lo)) * (r1 - r0);
      };
    } else {
      step = niceStep(hi - lo, 5);
      lo = Math.floor(lo / step) * step;
      hi = Math.ceil(hi / step) * step;
      for (v = lo; v <= hi + step / 2; v += step) {
        ticks.push(Math.abs(v) < step / 1e6 ? 0 : v);
      }
      m = function (x) {
        return r0 + (x - lo) / (hi - lo) * (r1 - r0);
      };
    }
    a.lo = lo;
    a.hi = hi;
    a.ticks = ticks;
    a.map = m;
    return a;
  }

  /*
   * opts: id, title, xLabel, yLabel, logX, logY, base2X, xFmt, yFmt,
   * width, height, legendInside, series: [{name, color, dash, markers,
 * points: [[x,y]]}],
   * vlines: [{x, label, color, id}], dots: [{x, y, color, label, id}].
   */
  function line(opts) {
    var nser = (opts.series || []).length;
    var legendH = opts.legendInside ? 0 : 18 * nser + 6;
    var W = opts.width || 720;
    var H = (opts.height || 380) + legendH;
    var L = 78, R = 20, T = 42, B = 58 + legendH;
    var xf = opts.xFmt || fmtNum;
    var yf = opts.yFmt || fmtNum;
    var svg = el('svg', {id: opts.id, 'class': 'kvf-chart', width: W,
                         height: H, viewBox: '0 0 ' + W + ' ' + H,
                         role: 'img'});
    var xs = [], ys = [];
    var i, k, x, y, g, d, s;

    (opts.series || []).forEach(function (ser) {
      ser.points.forEach(function (p) {
        if (isFinite(p[0]) && isFinite(p[1]) &&
            (!opts.logX || p[0] > 0) && (!opts.logY || p[1] > 0)) {
          xs.push(p[0]);
          ys.push(p[1]);
        }
      });
    });
    (opts.dots || []).forEach(function (p) {
      if (isFinite(p.y) && (!opts.logY || p.y > 0)) {
        ys.push(p.y);
      }
    });
    if (xs.length === 0) {
      xs = [1, 2];
      ys = [1, 2];
    }
    x = axis(Math.min.apply(null, xs), Math.max.apply(null, xs), opts.logX,
             opts.base2X, L, W - R);
    y = axis(opts.logY ? Math.min.apply(null, ys)
                       : Math.min(0, Math.min.apply(null, ys)),
             Math.max.apply(null, ys), opts.logY, false, H - B, T);
    el('text', {x: W / 2, y: 20, 'text-anchor': 'middle',
                'class': 'kvf-title'}, svg, opts.title || '');
    g = el('g', {'class': 'kvf-grid'}, svg);
    x.ticks.forEach(function (t) {
      var px = x.map(t);
      el('line', {x1: px, x2: px, y1: T, y2: H - B, stroke: '#e3e3e3'}, g);
      el('text', {x: px, y: H - B + 16, 'text-anchor': 'middle',
                  'class': 'kvf-tick'}, g, xf(t));
    });
    y.ticks.forEach(function (t) {
      var py = y.map(t);
      el('line', {x1: L, x2: W - R, y1: py, y2: py, stroke: '#e3e3e3'}, g);
      el('text', {x: L - 6, y: py + 4, 'text-anchor': 'end',
                  'class': 'kvf-tick'}, g, yf(t));
    });
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B,
                fill: 'none', stroke: '#999'}, svg);
    el('text', {x: (L + W - R) / 2, y: H - B + 36, 'text-anchor': 'middle',
                'class': 'kvf-label'}, svg, opts.xLabel || '');
    el('text', {x: 16, y: (T + H - B) / 2, 'text-anchor': 'middle',
                transform: 'rotate(-90 16 ' + (T + H - B) / 2 + ')',
                'class': 'kvf-label'}, svg, opts.yLabel || '');

    (opts.vlines || []).forEach(function (v) {
      var px;
      if (!isFinite(v.x) || v.x < x.lo || v.x > x.hi) {
        return;
      }
      px = x.map(v.x);
      el('line', {id: v.id, x1: px, x2: px, y1: T, y2: H - B,
                  stroke: v.color || '#444', 'stroke-dasharray': '5 4',
                  'stroke-width': 1.5, 'data-x': v.x}, svg);
      el('text', {x: px + 4, y: T + 14, 'class': 'kvf-mark',
                  fill: v.color || '#444'}, svg, v.label || '');
    });
    (opts.series || []).forEach(function (ser, si) {
      var pts = ser.points.filter(function (p) {
        return isFinite(p[0]) && isFinite(p[1]) &&
               (!opts.logX || p[0] > 0) && (!opts.logY || p[1] > 0);
      });
      d = '';
      for (k = 0; k < pts.length; k++) {
        d += (k ? 'L' : 'M') + x.map(pts[k][0]).toFixed(2) + ' ' +
             y.map(pts[k][1]).toFixed(2);
      }
      s = el('g', {'class': 'kvf-series', 'data-name': ser.name}, svg);
      el('path', {d: d, fill: 'none', stroke: ser.color,
                  'stroke-width': ser.width || 2.2,
                  'stroke-dasharray': ser.dash}, s);
      if (ser.markers) {
        pts.forEach(function (p) {
          var c = el('circle', {cx: x.map(p[0]), cy: y.map(p[1]), r: 3.5,
                                fill: ser.color, 'data-x': p[0],
                                'data-y': p[1]}, s);
          el('title', {}, c, ser.name + ': ' + xf(p[0]) + ', ' + yf(p[1]));
        });
      }
      /* legend: inside the plot's top left, or below the x label */
      i = opts.legendInside ? T + 8 + si * 18 : H - legendH + 8 + si * 18;
      el('line', {x1: L + 12, x2: L + 36, y1: i, y2: i, stroke: ser.color,
                  'stroke-width': 3, 'stroke-dasharray': ser.dash}, svg);
      el('text', {x: L + 42, y: i + 4, 'class': 'kvf-legend'}, svg,
         ser.name);
    });
    (opts.dots || []).forEach(function (p) {
      var c;
      if (!isFinite(p.x) || !isFinite(p.y) || p.x < x.lo || p.x > x.hi) {
        return;
      }
      c = el('circle', {id: p.id, cx: x.map(p.x), cy: y.map(p.y), r: 5,
                        fill: '#fff', stroke: p.color || '#000',
                        'stroke-width': 2, 'data-x': p.x, 'data-y': p.y},
             svg);
      el('title', {}, c, p.label || '');
    });
    return svg;
  }

  /*
   * Horizontal grouped bars. opts: id, title, categories: [label],
   * groups: [{name, color, values: [v|null]}], xLabel, fmt, logX,
   * width; marks: [{category, value, label}] draws a tick on a bar row.
   */
  function bars(opts) {
    var cats = opts.categories || [];
    var groups = opts.groups || [];
    var rowH = Math.max(22, 12 * groups.length + 10);
    var W = opts.width || 720;
    var L = 230, R = 70, T = 44 + 16 * groups.length, B = 40;
    var H = T + B + rowH * Math.max(1, cats.length);
    var fmt = opts.fmt || fmtNum;
    var svg = el('svg', {id: opts.id, 'class': 'kvf-chart', width: W,
                         height: H, viewBox: '0 0 ' + W + ' ' + H,
                         role: 'img'});
    var vals = [];
    var x, gH;

    groups.forEach(function (g) {
      g.values.forEach(function (v) {
        if (v !== null && isFinite(v) && (!opts.logX || v > 0)) {
          vals.push(v);
        }
      });
    });
    if (vals.length === 0) {
      vals = [1];
    }
    x = axis(opts.logX ? Math.min.apply(null, vals) : 0,
             Math.max.apply(null, vals), opts.logX, false, L, W - R);
    el('text', {x: W / 2, y: 20, 'text-anchor': 'middle',
                'class': 'kvf-title'}, svg, opts.title || '');
    groups.forEach(function (g, gi) {
      var ly = 38 + gi * 16;
      el('rect', {x: L, y: ly - 9, width: 14, height: 10, fill: g.color},
         svg);
      el('text', {x: L + 20, y: ly, 'class': 'kvf-legend'}, svg, g.name);
    });
    x.ticks.forEach(function (t) {
      var px = x.map(t);
      el('line', {x1: px, x2: px, y1: T, y2: H - B, stroke: '#e3e3e3'}, svg);
      el('text', {x: px, y: H - B + 16, 'text-anchor': 'middle',
                  'class': 'kvf-tick'}, svg, fmt(t));
    });
    el('text', {x: (L + W - R) / 2, y: H - 8, 'text-anchor': 'middle',
                'class': 'kvf-label'}, svg, opts.xLabel || '');
    gH = (rowH - 8) / Math.max(1, groups.length);
    cats.forEach(function (c, ci) {
      var y0 = T + ci * rowH + 4;
      var label = c.length > 34 ? c.slice(0, 33) + '…' : c;
      var t = el('text', {x: L - 8, y: y0 + rowH / 2, 'text-anchor': 'end',
                          'class': 'kvf-tick'}, svg, label);
      el('title', {}, t, c);
      groups.forEach(function (g, gi) {
        var v = g.values[ci];
        var x0 = x.map(opts.logX ? x.lo : 0);
        var r, w;
        if (v === null || v === undefined || !isFinite(v) ||
            (opts.logX && v <= 0)) {
          return;
        }
        w = Math.max(1, x.map(v) - x0);
        r = el('rect', {x: x0, y: y0 + gi * gH, width: w,
                        height: Math.max(2, gH - 2), fill: g.color,
                        'data-value': v, 'data-group': g.name,
                        'data-category': c}, svg);
        el('title', {}, r, c + ' — ' + g.name + ': ' + fmt(v));
        el('text', {x: x0 + w + 4, y: y0 + gi * gH + gH / 2 + 3,
                    'class': 'kvf-value'}, svg, fmt(v));
      });
    });
    (opts.marks || []).forEach(function (m) {
      var ci = cats.indexOf(m.category);
      var px, y0;
      if (ci < 0 || !isFinite(m.value) || m.value < x.lo ||
          m.value > x.hi) {
        return;
      }
      px = x.map(m.value);
      y0 = T + ci * rowH + 2;
      el('line', {x1: px, x2: px, y1: y0, y2: y0 + rowH - 4,
                  stroke: m.color || '#000', 'stroke-width': 2.5,
                  'data-value': m.value}, svg);
    });
    el('line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#999'}, svg);
    return svg;
  }

  return {line: line, bars: bars, fmtNum: fmtNum, fmtBytes: fmtBytes,
          fmtSeconds: fmtSeconds, el: el};
})();
