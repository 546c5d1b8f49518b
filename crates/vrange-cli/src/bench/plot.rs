//! A minimal SVG plot writer: lines (x numeric, linear or log axes) and grouped bars. Enough
//! to see a suite's shape at a glance; the numbers themselves are in the tables and CSV files.

use std::fmt::Write as _;

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 90.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (published numbers beside ours).
    pub dashed: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            dashed: false,
        }
    }
}

/// An axis: its label, whether it is logarithmic, and how to write tick values.
pub struct Axis {
    pub label: String,
    pub log: bool,
    pub format: fn(f64) -> String,
}

impl Axis {
    pub fn new(label: impl Into<String>, log: bool, format: fn(f64) -> String) -> Axis {
        Axis {
            label: label.into(),
            log,
            format,
        }
    }
}

pub fn plain(v: f64) -> String {
    if v.abs() >= 1e4 || (v != 0.0 && v.abs() < 1e-2) {
        format!("{v:.1e}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
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
    from: f64,
    to: f64,
}

impl Scale {
    fn new(values: impl Iterator<Item = f64>, log: bool, from: f64, to: f64, zero: bool) -> Scale {
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
            lo = 10f64.powf(lo.log10().floor());
            hi = 10f64.powf(hi.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
        } else {
            if zero {
                lo = lo.min(0.0);
            }
            if hi <= lo {
                hi = lo + 1.0;
            }
            hi += (hi - lo) * 0.05;
        }
        Scale {
            lo,
            hi,
            log,
            from,
            to,
        }
    }

    fn map(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.from + t * (self.to - self.from)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            let step = ((b - a) / 8).max(1);
            (a..=b)
                .step_by(step as usize)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            let span = self.hi - self.lo;
            let raw = span / 6.0;
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| span / s <= 8.0)
                .unwrap_or(mag * 10.0);
            let mut t = (self.lo / step).ceil() * step;
            let mut v = Vec::new();
            while t <= self.hi + step * 1e-9 {
                v.push(t);
                t += step;
            }
            v
        }
    }
}

fn header(title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title)
    );
    s
}

fn y_axis(s: &mut String, y: &Scale, axis: &Axis) {
    for t in y.ticks() {
        let py = y.map(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            esc(&(axis.format)(t))
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        esc(&axis.label)
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        W - RIGHT - LEFT,
        H - BOTTOM - TOP
    );
}

fn legend(s: &mut String, names: &[(&str, bool)]) {
    for (i, (name, dashed)) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 18.0;
        let x = W - RIGHT + 12.0;
        let dash = if *dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="3"{dash}/><text x="{}" y="{}">{}</text>"#,
            x + 22.0,
            COLORS[i % COLORS.len()],
            x + 28.0,
            y + 4.0,
            esc(name)
        );
    }
}

/// A line plot of `series` against numeric x values.
pub fn lines(title: &str, x: &Axis, y: &Axis, series: &[Series]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let mut xs = Scale::new(all().map(|p| p.0), x.log, LEFT, W - RIGHT, false);
    // A log axis over a few sizes (powers of two) is labelled at the sizes themselves.
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
    let ys = Scale::new(all().map(|p| p.1), y.log, H - BOTTOM, TOP, true);
    let mut s = header(title);
    y_axis(&mut s, &ys, y);
    for t in xticks {
        let px = xs.map(t);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            esc(&(x.format)(t))
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 16.0,
        esc(&x.label)
    );
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = ser
            .points
            .iter()
            .filter(|(a, b)| a.is_finite() && b.is_finite() && (!x.log || *a > 0.0))
            .filter(|(_, b)| !y.log || *b > 0.0)
            .map(|&(a, b)| format!("{:.1},{:.1}", xs.map(a), ys.map(b)))
            .collect();
        let dash = if ser.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (a, b) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{a}" cy="{b}" r="3" fill="{color}"/>"#);
        }
    }
    let names: Vec<(&str, bool)> = series.iter().map(|s| (s.name.as_str(), s.dashed)).collect();
    legend(&mut s, &names);
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per category, one bar per series (`None`: no bar).
pub fn bars(
    title: &str,
    categories: &[String],
    y: &Axis,
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let ys = Scale::new(
        series.iter().flat_map(|(_, v)| v.iter().flatten().copied()),
        y.log,
        H - BOTTOM,
        TOP,
        true,
    );
    let mut s = header(title);
    y_axis(&mut s, &ys, y);
    let n = categories.len().max(1) as f64;
    let group = (W - RIGHT - LEFT) / n;
    let bar = group * 0.8 / series.len().max(1) as f64;
    let base = if y.log { ys.lo } else { 0f64.max(ys.lo) };
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + c as f64 * group + group * 0.1;
        for (k, (_, values)) in series.iter().enumerate() {
            let Some(v) = values.get(c).copied().flatten() else {
                continue;
            };
            if !v.is_finite() || (y.log && v <= 0.0) {
                continue;
            }
            let (top, bottom) = (ys.map(v), ys.map(base));
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                gx + k as f64 * bar,
                top.min(bottom),
                bar.max(1.0),
                (bottom - top).abs(),
                COLORS[k % COLORS.len()],
                esc(&(y.format)(v))
            );
        }
        let (lx, ly) = (gx + group * 0.4, H - BOTTOM + 14.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly}" text-anchor="end" transform="rotate(-25 {lx:.1} {ly})">{}</text>"#,
            esc(cat)
        );
    }
    let names: Vec<(&str, bool)> = series.iter().map(|(n, _)| (n.as_str(), false)).collect();
    legend(&mut s, &names);
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_well_formed_enough() {
        let x = Axis::new("size", true, plain);
        let y = Axis::new("time", true, plain);
        let svg = lines(
            "t",
            &x,
            &y,
            &[Series::new("a <b>", vec![(1.0, 2.0), (10.0, 300.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("polyline") && svg.contains("a &lt;b&gt;"));
        let b = bars(
            "b",
            &["1".into(), "2".into()],
            &Axis::new("rate", false, plain),
            &[("x".into(), vec![Some(1.0), None])],
        );
        assert_eq!(b.matches("<rect").count(), 3, "{b}");
    }
}
