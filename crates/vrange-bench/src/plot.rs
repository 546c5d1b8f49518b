//! The suites' SVG plots: lines (numeric x, linear or log axes), grouped bars and labelled
//! points (scatter), written by hand. Enough to see a suite's shape at a glance; the numbers
//! are in the tables and CSV files.
//!
//! Every figure says what it shows and where it was measured: a title, a line with the machine
//! and the date, and for `--quick` runs a "SMOKE TEST" banner and watermark, so a smoke run's
//! plot is never mistaken for a measurement. Tick labels carry the axis unit with one prefix
//! rule per axis (`4 KiB`, `2 MiB`; `10 ns`, `1 µs`), and every series stays visible when
//! series coincide (managed and hybrid mark costs are the same line): each has its own colour,
//! hollow marker shape and dash pattern, earlier series are drawn wider underneath later ones,
//! and markers are drawn over all the lines.
//!
//! Why not a plotting crate: these three chart kinds are all the suites draw, and the defects
//! were in choices (labels, units, draw order), not in drawing; a library would add
//! dependencies to an installed binary and still need the marking, the tick values at the
//! measured sizes and the machine line done by hand.

use std::fmt::Write as _;

const W: f64 = 820.0;
const H: f64 = 500.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 220.0;
const TOP: f64 = 76.0;
const BOTTOM: f64 = 90.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
/// Dash patterns, by series: solid first (ours, in the suites), then patterns that let a line
/// underneath show through.
const DASHES: [&str; 6] = ["", "9,4", "2,3", "12,3,3,3", "5,2", "1,3"];
/// What `--quick` plots say, in the banner and (shorter) as a watermark.
pub const SMOKE: &str = "SMOKE TEST (--quick): not a measurement";

/// What frames every plot: the title, the machine and date, whether it is a smoke test.
pub struct Figure {
    pub title: String,
    pub about: String,
    pub smoke: bool,
}

/// One named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// What an axis's values are; tick labels are written in it with a prefix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unit {
    /// A number whose unit the axis label names; thousands separated ("102,400").
    Plain,
    /// Nanoseconds, written ns, µs, ms or s.
    Nanoseconds,
    /// Bytes, written with binary prefixes (4 KiB, 2 MiB).
    Bytes,
    /// A count or rate, written with decimal prefixes (20 k, 1.5 M).
    Count,
}

impl Unit {
    /// The prefixes: divisor and suffix, smallest first.
    fn prefixes(self) -> &'static [(f64, &'static str)] {
        const KI: f64 = 1024.0;
        match self {
            Unit::Plain => &[(1.0, "")],
            Unit::Nanoseconds => &[(1.0, "ns"), (1e3, "µs"), (1e6, "ms"), (1e9, "s")],
            Unit::Bytes => &[
                (1.0, "B"),
                (KI, "KiB"),
                (KI * KI, "MiB"),
                (KI * KI * KI, "GiB"),
                (KI * KI * KI * KI, "TiB"),
            ],
            Unit::Count => &[(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")],
        }
    }

    /// The largest prefix `v` reaches (the smallest for 0).
    fn prefix(self, v: f64) -> (f64, &'static str) {
        let p = self.prefixes();
        p.iter()
            .rev()
            .find(|(d, _)| v.abs() >= *d * (1.0 - 1e-9))
            .copied()
            .unwrap_or(p[0])
    }

    /// The logarithm base of this unit's natural ticks.
    fn base(self) -> f64 {
        if self == Unit::Bytes {
            2.0
        } else {
            10.0
        }
    }

    /// Tick labels. A log axis writes each tick with its own prefix and only the digits it
    /// needs ("10 ns", "100 ns", "1 µs"); a linear axis writes all with the prefix of the
    /// largest and the decimals of the step ("0", "20 k", ..., "120 k").
    fn labels(self, ticks: &[f64], log: bool) -> Vec<String> {
        let with = |number: String, suffix: &str| {
            if suffix.is_empty() || number == "0" {
                number
            } else {
                format!("{number} {suffix}")
            }
        };
        if log {
            return ticks
                .iter()
                .map(|&t| {
                    let (d, suffix) = self.prefix(t);
                    with(self.number(trim(t / d)), suffix)
                })
                .collect();
        }
        let top = ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
        let (d, suffix) = self.prefix(top);
        let step = ticks
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(f64::MAX, f64::min);
        let decimals = if step.is_finite() && step > 0.0 {
            (-(step / d).log10().floor()).max(0.0) as usize
        } else {
            0
        };
        ticks
            .iter()
            .map(|&t| {
                let t = if t.abs() < step * 1e-9 { 0.0 } else { t };
                let n = if t == 0.0 {
                    "0".to_string()
                } else {
                    format!("{:.decimals$}", t / d)
                };
                with(self.number(n), suffix)
            })
            .collect()
    }

    /// Thousands separators for plain numbers (as the tables write kB).
    fn number(self, n: String) -> String {
        if self != Unit::Plain {
            return n;
        }
        let (sign, n) = n.strip_prefix('-').map_or(("", n.as_str()), |r| ("-", r));
        let (int, frac) = n.split_once('.').unwrap_or((n, ""));
        let mut out = format!("{sign}{}", super::report::thousands(int));
        if !frac.is_empty() {
            out.push('.');
            out.push_str(frac);
        }
        out
    }
}

/// `v` with at most two decimals and none that are zero.
fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// An axis: its label (with the unit where the ticks do not carry it), whether it is
/// logarithmic, and the unit of its values.
pub struct Axis {
    pub label: String,
    pub log: bool,
    pub unit: Unit,
}

impl Axis {
    pub fn linear(label: impl Into<String>, unit: Unit) -> Axis {
        Axis {
            label: label.into(),
            log: false,
            unit,
        }
    }

    pub fn log(label: impl Into<String>, unit: Unit) -> Axis {
        Axis {
            label: label.into(),
            log: true,
            unit,
        }
    }

    /// The label as drawn: a log axis says so ("size (bytes, log scale)").
    fn title(&self) -> String {
        match self.label.strip_suffix(')') {
            _ if !self.log => self.label.clone(),
            Some(open) => format!("{open}, log scale)"),
            None => format!("{} (log scale)", self.label),
        }
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    base: f64,
    from: f64,
    to: f64,
}

impl Scale {
    fn new(values: impl Iterator<Item = f64>, axis: &Axis, from: f64, to: f64) -> Scale {
        let log = axis.log;
        let base = axis.unit.base();
        let vals: Vec<f64> = values
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .collect();
        let (mut lo, mut hi) = vals
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        if log {
            lo = base.powf(lo.log(base).floor());
            hi = base.powf(hi.log(base).ceil());
            if hi <= lo {
                hi = lo * base;
            }
        } else {
            lo = lo.min(0.0);
            if hi <= lo {
                hi = lo + 1.0;
            }
            hi += (hi - lo) * 0.05;
        }
        Scale {
            lo,
            hi,
            log,
            base,
            from,
            to,
        }
    }

    fn map(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.from + t * (self.to - self.from)
    }

    /// Powers of the unit's base on a log axis (every few if there are many), multiples of
    /// 1, 2 or 5 times a power of ten on a linear one.
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log(self.base).round() as i32,
                self.hi.log(self.base).round() as i32,
            );
            let step = ((b - a) as f64 / 9.0).ceil().max(1.0) as usize;
            (a..=b).step_by(step).map(|e| self.base.powi(e)).collect()
        } else {
            let span = self.hi - self.lo;
            let mag = 10f64.powf((span / 6.0).log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| span / s <= 8.0)
                .unwrap_or(mag * 10.0);
            let mut v = Vec::new();
            let mut k = (self.lo / step).ceil();
            while k * step <= self.hi + step * 1e-9 {
                v.push(k * step);
                k += 1.0;
            }
            v
        }
    }
}

/// The SVG header: title, machine and date, and the smoke-test banner.
fn header(fig: &Figure) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, "<title>{}</title>", esc(&fig.title));
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let mid = W / 2.0;
    let _ = writeln!(
        s,
        r#"<text x="{mid}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        esc(&fig.title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{mid}" y="40" text-anchor="middle" font-size="11" fill="#444">{}</text>"##,
        esc(&fig.about)
    );
    if fig.smoke {
        let _ = writeln!(
            s,
            r##"<text x="{mid}" y="60" text-anchor="middle" font-size="14" font-weight="bold" fill="#c00000">{}</text>"##,
            esc(SMOKE)
        );
    }
    s
}

/// The x grid at `xticks`, their labels and the axis title.
fn x_axis(s: &mut String, xs: &Scale, x: &Axis, xticks: &[f64]) {
    for (t, label) in xticks.iter().zip(x.unit.labels(xticks, x.log)) {
        let px = xs.map(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            esc(&label)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - BOTTOM + 44.0,
        esc(&x.title())
    );
}

/// The plot area's frame, the y grid and labels.
fn y_axis(s: &mut String, y: &Scale, axis: &Axis) {
    let ticks = y.ticks();
    for (t, label) in ticks.iter().zip(axis.unit.labels(&ticks, axis.log)) {
        let py = y.map(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            esc(&label)
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        esc(&axis.title())
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        W - RIGHT - LEFT,
        H - BOTTOM - TOP
    );
}

/// A smoke test's watermark across the plot area: over the data, and faint enough to read
/// the data through it.
fn watermark(s: &mut String, fig: &Figure) {
    if fig.smoke {
        let (cx, cy) = ((LEFT + W - RIGHT) / 2.0, (TOP + H - BOTTOM) / 2.0);
        let _ = writeln!(
            s,
            r##"<text x="{cx}" y="{cy}" text-anchor="middle" dominant-baseline="middle" font-size="54" font-weight="bold" fill="#c00000" fill-opacity="0.12" transform="rotate(-20 {cx} {cy})">SMOKE TEST</text>"##
        );
    }
}

/// How series `i` of `n` is drawn.
struct Style {
    color: &'static str,
    dash: &'static str,
    width: f64,
    marker: usize,
    size: f64,
}

impl Style {
    fn of(i: usize) -> Style {
        Style {
            color: COLORS[i % COLORS.len()],
            dash: DASHES[i % DASHES.len()],
            // Wider first: a later series on the same values leaves an edge of it showing.
            width: (4.5 - 0.5 * i as f64).max(1.5),
            marker: i % MARKERS,
            size: (5.5 - 0.3 * i as f64).max(3.0),
        }
    }

    fn dash_attr(&self) -> String {
        if self.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, self.dash)
        }
    }

    fn line(&self, points: &str) -> String {
        format!(
            r#"<polyline points="{points}" fill="none" stroke="{}" stroke-width="{}" stroke-opacity="0.85" stroke-linejoin="round"{}/>"#,
            self.color,
            self.width,
            self.dash_attr()
        )
    }

    /// A hollow marker at (x, y): hollow, so markers at one point do not cover each other.
    fn marker(&self, x: f64, y: f64) -> String {
        let (r, c) = (self.size, self.color);
        let shape = match self.marker {
            0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r:.1}""#),
            1 => format!(
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}""#,
                x - r * 0.85,
                y - r * 0.85,
                r * 1.7,
                r * 1.7
            ),
            2 => polygon(&[(x, y - r), (x + r, y + r * 0.8), (x - r, y + r * 0.8)]),
            3 => polygon(&[(x, y - r * 1.2), (x + r, y), (x, y + r * 1.2), (x - r, y)]),
            4 => polygon(&[(x, y + r), (x + r, y - r * 0.8), (x - r, y - r * 0.8)]),
            5 => format!(
                r#"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}""#,
                x - r,
                y - r,
                x + r,
                y + r,
                x - r,
                y + r,
                x + r,
                y - r
            ),
            _ => format!(
                r#"<path d="M{:.1} {y:.1}L{:.1} {y:.1}M{x:.1} {:.1}L{x:.1} {:.1}""#,
                x - r * 1.2,
                x + r * 1.2,
                y - r * 1.2,
                y + r * 1.2
            ),
        };
        format!(r#"{shape} fill="white" fill-opacity="0.6" stroke="{c}" stroke-width="1.6"/>"#)
    }
}

/// The number of marker shapes: circle, square, triangle, diamond, inverted triangle, ×, +.
const MARKERS: usize = 7;

fn polygon(p: &[(f64, f64)]) -> String {
    let pts: Vec<String> = p.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    format!(r#"<polygon points="{}""#, pts.join(" "))
}

/// The legend, right of the plot: a sample of each series' line and marker (or a swatch of
/// its bar colour) and its name.
fn legend(s: &mut String, names: &[&str], bars: bool) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = W - RIGHT + 12.0;
        let style = Style::of(i);
        if bars {
            let _ = writeln!(
                s,
                r#"<rect x="{x}" y="{}" width="26" height="12" fill="{}"/>"#,
                y - 6.0,
                style.color
            );
        } else {
            let _ = writeln!(s, "{}", style.line(&format!("{x},{y} {},{y}", x + 26.0)));
            let _ = writeln!(s, "{}", style.marker(x + 13.0, y));
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            x + 34.0,
            y + 4.0,
            esc(name)
        );
    }
}

/// A line plot of `series` against numeric x values.
pub fn lines(fig: &Figure, x: &Axis, y: &Axis, series: &[Series]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let mut xs = Scale::new(all().map(|p| p.0), x, LEFT, W - RIGHT);
    // A log axis over a few sizes is labelled at the sizes themselves.
    let mut xvals: Vec<f64> = all()
        .map(|p| p.0)
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    xvals.sort_by(f64::total_cmp);
    xvals.dedup();
    let xticks = if x.log && !xvals.is_empty() && xvals.len() <= 12 {
        xs.lo = xvals[0] / 1.25;
        xs.hi = xvals[xvals.len() - 1] * 1.25;
        xvals
    } else {
        xs.ticks()
    };
    let ys = Scale::new(all().map(|p| p.1), y, H - BOTTOM, TOP);
    let mut s = header(fig);
    y_axis(&mut s, &ys, y);
    x_axis(&mut s, &xs, x, &xticks);
    let drawn: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|ser| {
            ser.points
                .iter()
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .filter(|(a, b)| (!x.log || *a > 0.0) && (!y.log || *b > 0.0))
                .map(|&(a, b)| (xs.map(a), ys.map(b)))
                .collect()
        })
        .collect();
    // Every line first, widest first; then every marker, so none hides under a line.
    for (i, pts) in drawn.iter().enumerate() {
        let text: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        let _ = writeln!(s, "{}", Style::of(i).line(&text.join(" ")));
    }
    for (i, pts) in drawn.iter().enumerate() {
        // Long series get a marker every `every` points, each series at its own phase so
        // that series running together still show each one's markers.
        let every = pts.len().div_ceil(15).max(1);
        let phase = i * every / series.len().max(1);
        let style = Style::of(i);
        for (j, &(a, b)) in pts.iter().enumerate() {
            if (j + phase) % every == 0 || j + 1 == pts.len() {
                let _ = writeln!(s, "{}", style.marker(a, b));
            }
        }
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    watermark(&mut s, fig);
    legend(&mut s, &names, false);
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per category, one bar per series (`None`: no bar).
pub fn bars(
    fig: &Figure,
    categories: &[String],
    y: &Axis,
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let ys = Scale::new(
        series.iter().flat_map(|(_, v)| v.iter().flatten().copied()),
        y,
        H - BOTTOM,
        TOP,
    );
    let mut s = header(fig);
    y_axis(&mut s, &ys, y);
    let n = categories.len().max(1) as f64;
    let group = (W - RIGHT - LEFT) / n;
    let bar = group * 0.8 / series.len().max(1) as f64;
    let base = if y.log { ys.lo } else { 0f64.max(ys.lo) };
    let labels = |v: f64| y.unit.labels(&[v], true).remove(0);
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + c as f64 * group + group * 0.1;
        for (k, (name, values)) in series.iter().enumerate() {
            let Some(v) = values.get(c).copied().flatten() else {
                continue;
            };
            if !v.is_finite() || (y.log && v <= 0.0) {
                continue;
            }
            let (top, bottom) = (ys.map(v), ys.map(base));
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                gx + k as f64 * bar,
                top.min(bottom),
                bar.max(1.0),
                (bottom - top).abs(),
                Style::of(k).color,
                esc(name),
                esc(&labels(v))
            );
        }
        let (lx, ly) = (gx + group * 0.4, H - BOTTOM + 14.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly}" text-anchor="end" transform="rotate(-25 {lx:.1} {ly})">{}</text>"#,
            esc(cat)
        );
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    watermark(&mut s, fig);
    legend(&mut s, &names, true);
    s.push_str("</svg>\n");
    s
}

/// One labelled point of a scatter plot.
pub struct Labelled {
    pub label: String,
    /// Said after the label beside the point, not in the legend ("(1 OOM kill)").
    pub note: String,
    pub x: f64,
    pub y: f64,
}

/// The corner of a scatter plot a suite aims for: x at least `x`, y at least `y`, shaded, and
/// captioned under the legend (inside the plot the caption would cover points); `caption`'s
/// lines are separated by `\n`.
pub struct Target {
    pub x: f64,
    pub y: f64,
    pub caption: String,
}

/// The approximate box of `text` drawn at font size 11 with its anchor at (x, y) (the
/// baseline): (left, top, right, bottom).
fn text_box(text: &str, x: f64, y: f64, anchor: &str) -> (f64, f64, f64, f64) {
    let w = 6.0 * text.chars().count() as f64;
    let left = match anchor {
        "end" => x - w,
        "middle" => x - w / 2.0,
        _ => x,
    };
    (left, y - 10.0, left + w, y + 3.0)
}

fn overlap(a: (f64, f64, f64, f64), b: (f64, f64, f64, f64)) -> f64 {
    let w = (a.2.min(b.2) - a.0.max(b.0)).max(0.0);
    let h = (a.3.min(b.3) - a.1.max(b.1)).max(0.0);
    w * h
}

/// A scatter plot: each point a marker of its own (colour and shape, as the series of
/// [`lines`]) with its label beside it, and the same labels in the legend. Labels are placed
/// where they cover no other label or marker, nearest first (a thin leader line joins a label
/// set further away to its point), since points of similar configurations crowd together.
/// `mark` is a vertical reference line (an x value and its caption), within the x range.
pub fn scatter(
    fig: &Figure,
    x: &Axis,
    y: &Axis,
    points: &[Labelled],
    target: Option<&Target>,
    mark: Option<(f64, &str)>,
) -> String {
    let shown: Vec<&Labelled> = points
        .iter()
        .filter(|p| p.x.is_finite() && p.y.is_finite())
        .filter(|p| (!x.log || p.x > 0.0) && (!y.log || p.y > 0.0))
        .collect();
    let corner = target.map(|t| (t.x, t.y));
    let xs = Scale::new(
        shown
            .iter()
            .map(|p| p.x)
            .chain(corner.map(|c| c.0))
            .chain(mark.map(|m| m.0)),
        x,
        LEFT,
        W - RIGHT,
    );
    let ys = Scale::new(
        shown.iter().map(|p| p.y).chain(corner.map(|c| c.1)),
        y,
        H - BOTTOM,
        TOP,
    );
    let mut s = header(fig);
    y_axis(&mut s, &ys, y);
    let xticks = xs.ticks();
    x_axis(&mut s, &xs, x, &xticks);
    if let Some(t) = target {
        // Clipped to the plot area: the corner may lie outside the data's range.
        let left = xs.map(t.x).clamp(LEFT, W - RIGHT);
        let bottom = ys.map(t.y).clamp(TOP, H - BOTTOM);
        let _ = writeln!(
            s,
            r##"<rect x="{left:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#2ca02c" fill-opacity="0.10" stroke="#2ca02c" stroke-dasharray="6,3"/>"##,
            W - RIGHT - left,
            bottom - TOP
        );
    }
    let mut reserved = Vec::new();
    if let Some((mx, caption)) = mark {
        let px = xs.map(mx);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{}" stroke="#666" stroke-dasharray="3,3"/>"##,
            H - BOTTOM
        );
        let (cx, cy) = (px - 4.0, H - BOTTOM - 6.0);
        let _ = writeln!(
            s,
            r##"<text x="{cx:.1}" y="{cy:.1}" text-anchor="end" font-size="11" fill="#444">{}</text>"##,
            esc(caption)
        );
        reserved.push(text_box(caption, cx, cy, "end"));
    }
    let at: Vec<(f64, f64)> = shown.iter().map(|p| (xs.map(p.x), ys.map(p.y))).collect();
    let mut taken: Vec<(f64, f64, f64, f64)> = at
        .iter()
        .map(|&(px, py)| (px - 6.0, py - 6.0, px + 6.0, py + 6.0))
        .collect();
    taken.extend(reserved);
    let area = (LEFT, TOP, W - RIGHT, H - BOTTOM);
    let mut labels = String::new();
    for (i, (p, &(px, py))) in shown.iter().zip(&at).enumerate() {
        let text = if p.note.is_empty() {
            p.label.clone()
        } else {
            format!("{} {}", p.label, p.note)
        };
        // Beside the marker first, then further out in eight directions.
        let mut best: Option<(f64, f64, f64, &str)> = None;
        'search: for reach in [0.0, 14.0, 28.0, 42.0, 56.0] {
            for (dx, dy, anchor) in [
                (9.0, 4.0, "start"),
                (-9.0, 4.0, "end"),
                (0.0, -10.0, "middle"),
                (0.0, 18.0, "middle"),
                (9.0, -8.0, "start"),
                (-9.0, -8.0, "end"),
                (9.0, 16.0, "start"),
                (-9.0, 16.0, "end"),
            ] {
                let (lx, ly) = (px + dx + reach * dx.signum(), py + dy + reach * dy.signum());
                let b = text_box(&text, lx, ly, anchor);
                let outside = (area.0 - b.0).max(0.0)
                    + (b.2 - area.2).max(0.0)
                    + (area.1 - b.1).max(0.0)
                    + (b.3 - area.3).max(0.0);
                let cost = taken.iter().map(|&t| overlap(b, t)).sum::<f64>() + outside * 100.0;
                if best.is_none_or(|(c, ..)| cost < c) {
                    best = Some((cost, lx, ly, anchor));
                }
                if cost == 0.0 {
                    break 'search;
                }
            }
        }
        let Some((_, lx, ly, anchor)) = best else {
            continue;
        };
        taken.push(text_box(&text, lx, ly, anchor));
        if (lx - px).abs() > 20.0 || (ly - py).abs() > 22.0 {
            let _ = writeln!(
                labels,
                r##"<line x1="{px:.1}" y1="{py:.1}" x2="{lx:.1}" y2="{:.1}" stroke="#999" stroke-width="0.8"/>"##,
                ly - 4.0
            );
        }
        let _ = writeln!(
            labels,
            r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="{anchor}" font-size="11" fill="{}">{}</text>"#,
            Style::of(i).color,
            esc(&text)
        );
    }
    s.push_str(&labels);
    for (i, &(px, py)) in at.iter().enumerate() {
        let _ = writeln!(s, "{}", Style::of(i).marker(px, py));
    }
    watermark(&mut s, fig);
    for (i, p) in shown.iter().enumerate() {
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = W - RIGHT + 12.0;
        let _ = writeln!(s, "{}", Style::of(i).marker(lx + 13.0, ly));
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 34.0,
            ly + 4.0,
            esc(&p.label)
        );
    }
    if let Some(t) = target {
        let ly = TOP + 14.0 + shown.len() as f64 * 20.0;
        let lx = W - RIGHT + 12.0;
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{}" width="26" height="12" fill="#2ca02c" fill-opacity="0.10" stroke="#2ca02c" stroke-dasharray="6,3"/>"##,
            ly - 6.0
        );
        for (k, line) in t.caption.lines().enumerate() {
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" fill="#1a6e1a">{}</text>"##,
                lx + 34.0,
                ly + 4.0 + k as f64 * 15.0,
                esc(line)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(smoke: bool) -> Figure {
        Figure {
            title: "t".into(),
            about: "AMD EPYC, 2 cores; 2026-01-02".into(),
            smoke,
        }
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let x = Axis::log("size", Unit::Bytes);
        let y = Axis::log("time", Unit::Nanoseconds);
        let svg = lines(
            &fig(false),
            &x,
            &y,
            &[Series::new("a <b>", vec![(4096.0, 2.0), (65536.0, 300.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("polyline") && svg.contains("a &lt;b&gt;"));
        assert!(svg.contains("AMD EPYC, 2 cores; 2026-01-02"), "{svg}");
        assert!(!svg.contains("SMOKE"), "{svg}");
        let b = bars(
            &fig(true),
            &["1".into(), "2".into()],
            &Axis::linear("rate", Unit::Count),
            &[("x".into(), vec![Some(1.0), None])],
        );
        // Background, plot frame, one bar, one legend swatch.
        assert_eq!(b.matches("<rect").count(), 4, "{b}");
        assert!(b.contains(SMOKE), "{b}");
    }

    #[test]
    fn log_ticks_carry_their_own_prefix_and_no_padding() {
        let ns = Unit::Nanoseconds.labels(&[10.0, 100.0, 1e3, 1e4, 1e6, 1e9], true);
        assert_eq!(ns, ["10 ns", "100 ns", "1 µs", "10 µs", "1 ms", "1 s"]);
        let b = Unit::Bytes.labels(&[4096.0, 65536.0, 2.0 * 1048576.0, 1073741824.0], true);
        assert_eq!(b, ["4 KiB", "64 KiB", "2 MiB", "1 GiB"]);
        let kb = Unit::Plain.labels(&[100.0, 1e3, 1e4, 1e5, 1e6], true);
        assert_eq!(kb, ["100", "1,000", "10,000", "100,000", "1,000,000"]);
    }

    #[test]
    fn linear_ticks_share_one_prefix_and_the_step_decimals() {
        let s = Scale::new(
            [0.0, 117_000.0].into_iter(),
            &Axis::linear("r", Unit::Count),
            0.0,
            1.0,
        );
        let ticks = s.ticks();
        let labels = Unit::Count.labels(&ticks, false);
        assert_eq!(labels[0], "0");
        assert!(labels[1..].iter().all(|l| l.ends_with(" k")), "{labels:?}");
        assert!(labels.iter().all(|l| !l.contains('.')), "{labels:?}");
        assert_eq!(
            Unit::Plain.labels(&[0.0, 0.5, 1.0, 1.5], false),
            ["0", "0.5", "1.0", "1.5"]
        );
    }

    #[test]
    fn coinciding_series_stay_visible() {
        let same = vec![(4096.0, 80.0), (65536.0, 80.0)];
        let svg = lines(
            &fig(false),
            &Axis::log("size", Unit::Bytes),
            &Axis::log("time", Unit::Nanoseconds),
            &[
                Series::new("managed", same.clone()),
                Series::new("hybrid", same),
            ],
        );
        let widths: Vec<f64> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline"))
            .take(2)
            .map(|l| {
                let w = l.split("stroke-width=\"").nth(1).unwrap();
                w.split('"').next().unwrap().parse().unwrap()
            })
            .collect();
        assert!(
            widths[0] > widths[1],
            "the first is wider, drawn under: {widths:?}"
        );
        assert!(
            svg.contains("<circle") && svg.contains("<rect x="),
            "distinct markers"
        );
        assert!(
            svg.contains("stroke-dasharray"),
            "the second line is dashed"
        );
        // Both lines come before the first marker (the legend's samples come after).
        let first_marker = svg.find("<circle").unwrap();
        assert_eq!(svg[..first_marker].matches("<polyline").count(), 2, "{svg}");
    }

    #[test]
    fn scatter_labels_every_point_and_shades_the_target() {
        let points: Vec<Labelled> = (0..4)
            .map(|i| Labelled {
                label: format!("p{i} <x>"),
                note: if i == 0 {
                    "(note)".into()
                } else {
                    String::new()
                },
                x: 10.0 + i as f64,
                y: 1000.0,
            })
            .collect();
        let svg = scatter(
            &fig(true),
            &Axis::linear("returned (MiB)", Unit::Plain),
            &Axis::linear("ops/s", Unit::Count),
            &points,
            Some(&Target {
                x: 12.0,
                y: 900.0,
                caption: "target".into(),
            }),
            Some((13.0, "all")),
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Each label twice: beside its point and in the legend.
        for i in 0..4 {
            assert_eq!(svg.matches(&format!("p{i} &lt;x&gt;")).count(), 2, "{svg}");
        }
        assert!(svg.contains("fill-opacity=\"0.10\"") && svg.contains(">target<"));
        assert!(svg.contains(">all<"));
        assert_eq!(
            svg.matches("(note)").count(),
            1,
            "a note is not in the legend"
        );
        assert!(svg.contains(SMOKE));
    }
}
