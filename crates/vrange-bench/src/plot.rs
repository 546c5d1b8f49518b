//! The suites' SVG plots: lines (numeric x, linear or log axes), grouped bars and labelled
//! points (scatter). Enough to see a suite's shape at a glance; the numbers are in the tables
//! and CSV files.
//!
//! `plotters` draws them: its SVG backend into a `String` (no font library: the SVG viewer
//! lays the text out), its linear and log coordinates, grid, marker shapes and legend. What
//! this module adds is the choices a figure needs to be read right:
//!
//! - A title, a line with the machine and the date, and for `--quick` runs a "SMOKE TEST"
//!   banner and a faint watermark, so a smoke run's plot is never mistaken for a measurement.
//! - Tick labels in the axis's unit with one prefix rule per axis: each its own on a log axis
//!   (`4 KiB`, `64 KiB`; `10 ns`, `1 µs`), the top's for all on a linear one (`0, 20 k, ...,
//!   120 k`); a log x axis is ticked at the measured values where they are few, and a log
//!   axis's title says "log scale".
//! - Series stay visible when they coincide: each has its own colour, hollow marker shape and
//!   dash pattern, earlier series are drawn wider underneath later ones, markers over all lines.
//! - The legend goes in the plot area's corner with the fewest points; a scatter plot's points
//!   are labelled beside them (not in the legend) where the label covers no other label or
//!   marker, and its target corner is shaded.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;

const W: u32 = 820;
const H: u32 = 500;
/// The y axis's labels and title, left of the plot area.
const LEFT: u32 = 84;
/// The title, the machine line and the smoke-test banner.
const TOP: u32 = 76;
/// Right of the plot area.
const RIGHT: u32 = 24;
/// The x axis's labels and title.
const BOTTOM: u32 = 50;
/// The series' colours (as matplotlib's), by series.
const COLORS: [u32; 10] = [
    0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22,
    0x17becf,
];
/// Dash patterns (dash, gap in pixels; 0: solid), by series: solid first (ours, in the
/// suites), then patterns that let a line underneath show through.
const DASHES: [(u32, u32); 5] = [(0, 0), (10, 4), (3, 3), (18, 5), (6, 2)];
const GREY: RGBColor = RGBColor(0x44, 0x44, 0x44);
const SMOKE_RED: RGBColor = RGBColor(0xc0, 0x00, 0x00);
const TARGET_GREEN: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
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

/// A prefix: its divisor and suffix.
type Prefix = (f64, &'static str);

impl Unit {
    /// The prefixes, smallest first.
    fn prefixes(self) -> &'static [Prefix] {
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
    fn prefix(self, v: f64) -> Prefix {
        let p = self.prefixes();
        p.iter()
            .rev()
            .find(|(d, _)| v.abs() >= *d * (1.0 - 1e-9))
            .copied()
            .unwrap_or(p[0])
    }

    /// The label of tick `v`: with `fixed`'s prefix and decimals (a linear axis: those of its
    /// top and step, "0", "20 k", ..., "120 k"), else with its own prefix and only the digits
    /// it needs ("10 ns", "100 ns", "1 µs").
    fn label(self, v: f64, fixed: Option<(Prefix, usize)>) -> String {
        let ((_, suffix), n) = match fixed {
            Some((p, decimals)) => (p, format!("{:.decimals$}", v / p.0)),
            None => {
                let p = self.prefix(v);
                (p, trim(v / p.0))
            }
        };
        if n.chars().all(|c| "-0.".contains(c)) {
            return "0".into();
        }
        let n = self.number(n);
        if suffix.is_empty() {
            n
        } else {
            format!("{n} {suffix}")
        }
    }

    /// Thousands separators for plain numbers (as the tables write kB).
    fn number(self, n: String) -> String {
        if self != Unit::Plain {
            return n;
        }
        let (sign, n) = n.strip_prefix('-').map_or(("", n.as_str()), |r| ("-", r));
        let (int, frac) = n.split_once('.').unwrap_or((n, ""));
        let dot = if frac.is_empty() { "" } else { "." };
        format!("{sign}{}{dot}{frac}", super::report::thousands(int))
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

    /// The coordinate over `values`: on a log axis from and to powers of the unit's base around
    /// them, ticked at powers (every few if many); on a linear one from 0 (or below) to a little
    /// above the largest, ticked where plotters chooses.
    fn coord(&self, values: impl Iterator<Item = f64>) -> Coord {
        let (lo, hi) = values
            .filter(|v| v.is_finite() && (!self.log || *v > 0.0))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        let (lo, hi) = if lo.is_finite() {
            (lo, hi)
        } else {
            (1.0, 10.0)
        };
        if !self.log {
            let (lo, hi) = (lo.min(0.0), hi.max(lo.min(0.0) + 1.0));
            return Coord::Linear(lo..hi + (hi - lo) * 0.05);
        }
        let base = if self.unit == Unit::Bytes { 2.0 } else { 10.0 };
        let (a, b) = (lo.log(base).floor() as i32, hi.log(base).ceil() as i32);
        let b = b.max(a + 1);
        let step = ((b - a) as f64 / 9.0).ceil().max(1.0) as usize;
        let ticks = (a..=b).step_by(step).map(|e| base.powi(e)).collect();
        Coord::Log(base.powi(a)..base.powi(b), ticks)
    }
}

/// An axis's coordinate, made a plotters coordinate by `with_coord!`.
enum Coord {
    Linear(Range<f64>),
    /// The range and the ticks.
    Log(Range<f64>, Vec<f64>),
}

impl Coord {
    fn range(&self) -> Range<f64> {
        match self {
            Coord::Linear(r) | Coord::Log(r, _) => r.clone(),
        }
    }

    /// The tick labels in `unit`; a linear axis's share the prefix of its largest tick and
    /// the decimals of its step.
    fn labels(&self, unit: Unit) -> impl Fn(&f64) -> String {
        let fixed = match self {
            Coord::Log(..) => None,
            Coord::Linear(r) => {
                let ticks = RangedCoordf64::from(r.clone()).key_points(11);
                let top = ticks.iter().fold(0f64, |m, t| m.max(t.abs()));
                let p = unit.prefix(top);
                let step = ticks.get(1).zip(ticks.first()).map_or(1.0, |(b, a)| b - a);
                Some((p, (-(step / p.0).log10().floor()).max(0.0) as usize))
            }
        };
        move |v: &f64| unit.label(*v, fixed)
    }
}

/// `$body` with `$c` the plotters coordinate of `$coord` (linear or log: a type each, so
/// `$body` is compiled for each).
macro_rules! with_coord {
    ($coord:expr, |$c:ident| $body:expr) => {
        match $coord {
            Coord::Linear(r) => {
                let $c = r;
                $body
            }
            Coord::Log(r, ticks) => {
                let $c = r.log_scale().with_key_points(ticks);
                $body
            }
        }
    };
}

type Area<'s> = DrawingArea<SVGBackend<'s>, Shift>;
type Chart<'a, 's, X, Y> = ChartContext<'a, SVGBackend<'s>, Cartesian2d<X, Y>>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;
/// A tick label formatter.
type Labels<'f> = &'f dyn Fn(&f64) -> String;

/// Text of `px` pixels: plotters writes font-size = size / 1.24.
fn font(px: f64) -> FontDesc<'static> {
    FontDesc::new(FontFamily::SansSerif, px * 1.24, FontStyle::Normal)
}

/// `font` in `color`, anchored at its `h` side and its vertical middle.
fn text_style(font: FontDesc<'static>, color: &RGBColor, h: HPos) -> TextStyle<'static> {
    font.color(color).pos(Pos::new(h, VPos::Center))
}

/// A figure `height` pixels high: its title, machine line and smoke banner, and what `draw`
/// draws, as an SVG document. Drawing into a String fails only by a bug; a figure that
/// failed says so in itself rather than failing the suite that measured it.
fn render(fig: &Figure, height: u32, draw: impl FnOnce(&Area) -> Drawn) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, height)).into_drawing_area();
        let mid = (W / 2) as i32;
        let bold = |px| font(px).style(FontStyle::Bold);
        let banner = if fig.smoke { SMOKE } else { "" };
        let header = [
            (fig.title.as_str(), bold(16.0), BLACK, 18),
            (&fig.about, font(11.0), GREY, 37),
            (banner, bold(14.0), SMOKE_RED, 57),
        ];
        let drawn = root.fill(&WHITE).and_then(|()| {
            for (text, font, color, y) in header.into_iter().filter(|h| !h.0.is_empty()) {
                let style = text_style(font, &color, HPos::Center);
                root.draw(&Text::new(text, (mid, y), style))?;
            }
            draw(&root)
        });
        if let Err(e) = drawn {
            let style = text_style(font(14.0), &SMOKE_RED, HPos::Center);
            let at = (mid, (height / 2) as i32);
            let _ = root.draw(&Text::new(format!("plot failed: {e}"), at, style));
        }
        let _ = root.present();
    }
    svg
}

/// The chart in `root` with `bottom` pixels under it for the x axis: the grid at the axes'
/// ticks, their labels (under the middles of `groups` categories if any) and titles, and the
/// plot area's frame.
fn frame<'a, 's, X, Y>(
    root: &'a Area<'s>,
    (x, x_labels, x_title): (X, Labels, String),
    (y, y_labels, y_title): (Y, Labels, String),
    (bottom, groups): (u32, usize),
) -> Result<Chart<'a, 's, X::CoordDescType, Y::CoordDescType>, DrawingAreaErrorKind<std::io::Error>>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .margin_top(TOP)
        .margin_right(RIGHT)
        .x_label_area_size(bottom)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(x, y)?;
    let mut mesh = chart.configure_mesh();
    // Categories: grid lines between the groups, a label under each group's middle.
    if let Some(group) = (W - LEFT - RIGHT).checked_div(groups as u32) {
        mesh.x_labels(groups + 1).x_label_offset(group as i32 / 2);
    }
    mesh.bold_line_style(RGBColor(0xe2, 0xe2, 0xe2))
        .max_light_lines(0)
        .axis_style(BLACK)
        .set_all_tick_mark_size(4)
        .label_style(font(12.0))
        .axis_desc_style(font(12.0))
        .x_label_formatter(x_labels)
        .y_label_formatter(y_labels)
        .x_desc(x_title)
        .y_desc(y_title)
        .draw()?;
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    root.draw(&Rectangle::new(
        [(xs.start, ys.start), (xs.end, ys.end)],
        BLACK,
    ))?;
    Ok(chart)
}

/// What every chart ends with: the legend in the plot area's corner with the fewest of
/// `points`, and a smoke test's watermark across the plot area (over the data, faint enough
/// to read the data through it).
fn finish<'a, 's: 'a, X, Y>(
    root: &Area<'s>,
    chart: &mut Chart<'a, 's, X, Y>,
    fig: &Figure,
    points: &[(f64, f64)],
) -> Drawn
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    use SeriesLabelPosition::{LowerLeft, LowerRight, UpperLeft, UpperRight};
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    // Which fifths of the plot area's width and height each point is in.
    let fifths: Vec<(i32, i32)> = points
        .iter()
        .map(|p| chart.backend_coord(p))
        .map(|(x, y)| {
            (
                5 * (x - xs.start) / xs.len() as i32,
                5 * (y - ys.start) / ys.len() as i32,
            )
        })
        .collect();
    let corners = [
        (UpperRight, 3, 0),
        (UpperLeft, 0, 0),
        (LowerRight, 3, 3),
        (LowerLeft, 0, 3),
    ];
    let near = |(_, x, y): &(_, i32, i32)| {
        let near = |a: i32, b: i32| a == b || a == b + 1;
        fifths
            .iter()
            .filter(|f| near(f.0, *x) && near(f.1, *y))
            .count()
    };
    let (corner, ..) = corners.into_iter().min_by_key(near).expect("four corners");
    chart
        .configure_series_labels()
        .position(corner)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(font(12.0))
        .draw()?;
    if fig.smoke {
        let mark = font(56.0)
            .style(FontStyle::Bold)
            .color(&SMOKE_RED.mix(0.12));
        let mark = mark.pos(Pos::new(HPos::Center, VPos::Center));
        let mid = ((xs.start + xs.end) / 2, (ys.start + ys.end) / 2);
        root.draw(&Text::new("SMOKE TEST", mid, mark))?;
    }
    Ok(())
}

/// Series `i`'s colour.
fn color(i: usize) -> RGBColor {
    let c = COLORS[i % COLORS.len()];
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8)
}

/// Series `i`'s line: wider for earlier series, so a later one on the same values leaves an
/// edge of it showing.
fn line(i: usize) -> ShapeStyle {
    color(i).mix(0.85).stroke_width([5, 4, 3, 2][i.min(3)])
}

/// Series `i`'s marker at pixel `(x, y)`: hollow, so markers at one point do not cover each
/// other, of a shape of its own (circle, square, triangle, diamond, ×) drawn as one path,
/// and smaller for later series, to fit inside an earlier one.
fn marker(i: usize, (x, y): (i32, i32)) -> PathElement<(i32, i32)> {
    let r = f64::from([6, 6, 5, 5, 4][i.min(4)]);
    let circle: Vec<f64> = (0..=16)
        .map(|k| f64::from(k) * std::f64::consts::PI / 8.0)
        .flat_map(|a| [a.cos(), a.sin()])
        .collect();
    // Corners (x, y in radii) one after the other.
    let shape: &[f64] = match i % 5 {
        0 => &circle,
        1 => &[
            -0.85, -0.85, 0.85, -0.85, 0.85, 0.85, -0.85, 0.85, -0.85, -0.85,
        ],
        2 => &[0.0, -1.1, 1.0, 0.7, -1.0, 0.7, 0.0, -1.1],
        3 => &[0.0, -1.2, 1.0, 0.0, 0.0, 1.2, -1.0, 0.0, 0.0, -1.2],
        _ => &[-1.0, -1.0, 1.0, 1.0, 0.0, 0.0, -1.0, 1.0, 1.0, -1.0],
    };
    let pixel = |c: &[f64]| (x + (c[0] * r).round() as i32, y + (c[1] * r).round() as i32);
    let style = color(i).stroke_width(2);
    PathElement::new(shape.chunks(2).map(pixel).collect::<Vec<_>>(), style)
}

/// A line plot of `series` against numeric x values.
pub fn lines(fig: &Figure, x: &Axis, y: &Axis, series: &[Series]) -> String {
    let drawn: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|ser| {
            ser.points
                .iter()
                .copied()
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .filter(|(a, b)| (!x.log || *a > 0.0) && (!y.log || *b > 0.0))
                .collect()
        })
        .collect();
    let all = drawn.concat();
    // A log axis over a few values is ticked at the values themselves.
    let mut xvals: Vec<f64> = all.iter().map(|p| p.0).collect();
    xvals.sort_by(f64::total_cmp);
    xvals.dedup();
    let xc = match (xvals.first(), xvals.last()) {
        (Some(&lo), Some(&hi)) if x.log && xvals.len() <= 12 => {
            Coord::Log(lo / 1.25..hi * 1.25, xvals.clone())
        }
        _ => x.coord(xvals.iter().copied()),
    };
    let yc = y.coord(all.iter().map(|p| p.1));
    let (x_labels, y_labels) = (xc.labels(x.unit), yc.labels(y.unit));
    render(fig, H, |root| {
        with_coord!(xc, |cx| with_coord!(yc, |cy| {
            let mut chart = frame(
                root,
                (cx, &x_labels, x.title()),
                (cy, &y_labels, y.title()),
                (BOTTOM, 0),
            )?;
            // Every line first, widest first; then every marker, so none hides under a line.
            for (i, (pts, ser)) in drawn.iter().zip(series).enumerate() {
                let points = pts.iter().copied();
                let (on, off) = DASHES[i % DASHES.len()];
                match on {
                    0 => chart.draw_series(LineSeries::new(points, line(i)))?,
                    _ => chart.draw_series(DashedLineSeries::new(points, on, off, line(i)))?,
                }
                .label(ser.name.as_str())
                .legend(move |(x, y)| {
                    // A solid line: one dash longer than the sample.
                    let (on, off) = if on == 0 { (30, 1) } else { (on, off) };
                    let sample = DashedPathElement::new([(0, 0), (26, 0)], on, off, line(i));
                    EmptyElement::at((x, y)) + sample + marker(i, (13, 0))
                });
            }
            for (i, pts) in drawn.iter().enumerate() {
                // Long series get a marker every `every` points, each series at its own phase
                // so that series running together still show each one's markers.
                let every = pts.len().div_ceil(15).max(1);
                let phase = i * every / drawn.len();
                let last = pts.len().saturating_sub(1);
                let shown = pts.iter().enumerate();
                for (_, p) in shown.filter(|&(j, _)| (j + phase) % every == 0 || j == last) {
                    root.draw(&marker(i, chart.backend_coord(p)))?;
                }
            }
            finish(root, &mut chart, fig, &all)
        }))
    })
}

/// The width of a character of 12-pixel sans-serif text, roughly.
const CHAR: f64 = 6.6;

/// Grouped bars: one group per category, one bar per series (`None`: no bar). The categories'
/// labels are written across under their groups, or all upwards where one is wider than a
/// group.
pub fn bars(
    fig: &Figure,
    categories: &[String],
    y: &Axis,
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let n = categories.len();
    let shown = |v: &Option<f64>| v.filter(|v| v.is_finite() && (!y.log || *v > 0.0));
    let yc = y.coord(series.iter().flat_map(|(_, v)| v.iter().filter_map(shown)));
    let base = if y.log { yc.range().start } else { 0.0 };
    let longest = categories.iter().map(|c| c.chars().count()).max();
    let longest = longest.unwrap_or(0) as f64 * CHAR;
    let upwards = longest > f64::from(W - LEFT - RIGHT) / n.max(1) as f64 - 6.0;
    let bottom = if upwards { longest as u32 + 20 } else { 0 }.max(BOTTOM);
    let x_labels = |v: &f64| match categories.get(*v as usize) {
        Some(c) if !upwards => c.clone(),
        _ => String::new(),
    };
    let y_labels = yc.labels(y.unit);
    let bar = 0.8 / series.len().max(1) as f64;
    render(fig, H - BOTTOM + bottom, |root| {
        with_coord!(yc, |cy| {
            let cx = 0.0..n.max(1) as f64;
            let mut chart = frame(
                root,
                (cx, &x_labels, String::new()),
                (cy, &y_labels, y.title()),
                (bottom, n),
            )?;
            let mut ends = Vec::new();
            for (k, (name, values)) in series.iter().enumerate() {
                let color = color(k).filled();
                let left = |c: usize| c as f64 + 0.1 + k as f64 * bar;
                let bars = values.iter().take(n).enumerate().filter_map(|(c, v)| {
                    ends.extend([(c as f64 + 0.5, shown(v)?), (c as f64 + 0.5, base)]);
                    Some(Rectangle::new(
                        [(left(c), base), (left(c) + bar, shown(v)?)],
                        color,
                    ))
                });
                chart
                    .draw_series(bars)?
                    .label(name.as_str())
                    .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 26, y + 6)], color));
            }
            if upwards {
                // Plotters centres a rotated label on its tick: these end under the axis.
                let style = font(12.0).transform(FontTransform::Rotate270).color(&BLACK);
                let style = style.pos(Pos::new(HPos::Right, VPos::Center));
                let under = chart.plotting_area().get_pixel_range().1.end + 8;
                for (c, cat) in categories.iter().enumerate() {
                    let x = chart.backend_coord(&(c as f64 + 0.5, base)).0;
                    root.draw(&Text::new(cat.as_str(), (x, under), style.clone()))?;
                }
            }
            finish(root, &mut chart, fig, &ends)
        })
    })
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
/// captioned in the legend (inside the plot the caption would cover points); `caption`'s
/// lines are separated by `\n`.
pub struct Target {
    pub x: f64,
    pub y: f64,
    pub caption: String,
}

/// A pixel box: left, top, right, bottom.
type Box4 = (f64, f64, f64, f64);

/// The approximate box of `text` drawn at 11 pixels with its anchor at (x, y) (its vertical
/// middle).
fn text_box(text: &str, x: f64, y: f64, anchor: HPos) -> Box4 {
    let w = 6.0 * text.chars().count() as f64;
    let left = match anchor {
        HPos::Right => x - w,
        HPos::Center => x - w / 2.0,
        HPos::Left => x,
    };
    (left, y - 7.0, left + w, y + 6.0)
}

fn overlap(a: Box4, b: Box4) -> f64 {
    let w = (a.2.min(b.2) - a.0.max(b.0)).max(0.0);
    let h = (a.3.min(b.3) - a.1.max(b.1)).max(0.0);
    w * h
}

/// Where to write `text` for a point at `(px, py)`: beside it where it covers nothing
/// `taken` and stays in `area`, else further out in eight directions, else where it covers
/// least. Returns the anchor point and side.
fn place(text: &str, (px, py): (f64, f64), taken: &[Box4], area: Box4) -> (f64, f64, HPos) {
    let mut best: Option<(f64, f64, f64, HPos)> = None;
    for reach in [0.0, 14.0, 28.0, 42.0, 56.0] {
        // Right, left, above, below, then the four diagonals: dx, dy and the side
        // anchored (right, centre, left).
        let offsets = [
            9.0, 0.0, 2.0, -9.0, 0.0, 0.0, 0.0, -14.0, 1.0, 0.0, 14.0, 1.0, 9.0, -12.0, 2.0, -9.0,
            -12.0, 0.0, 9.0, 12.0, 2.0, -9.0, 12.0, 0.0f64,
        ];
        for d in offsets.chunks(3) {
            let (dx, dy) = (d[0], d[1]);
            let anchor = [HPos::Right, HPos::Center, HPos::Left][d[2] as usize];
            let (lx, ly) = (px + dx + reach * dx.signum(), py + dy + reach * dy.signum());
            let b = text_box(text, lx, ly, anchor);
            let outside = (area.0 - b.0).max(0.0)
                + (b.2 - area.2).max(0.0)
                + (area.1 - b.1).max(0.0)
                + (b.3 - area.3).max(0.0);
            let cost = taken.iter().map(|&t| overlap(b, t)).sum::<f64>() + outside * 100.0;
            if cost == 0.0 {
                return (lx, ly, anchor);
            }
            if best.is_none_or(|(c, ..)| cost < c) {
                best = Some((cost, lx, ly, anchor));
            }
        }
    }
    best.map_or((px, py, HPos::Left), |(_, lx, ly, anchor)| (lx, ly, anchor))
}

/// A scatter plot: each point a marker of its own (colour and shape, as the series of
/// [`lines`]) with its label beside it in its colour; the legend has only the target's
/// caption. Labels are placed
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
    let xc = x.coord(
        shown
            .iter()
            .map(|p| p.x)
            .chain(target.map(|t| t.x))
            .chain(mark.map(|m| m.0)),
    );
    let yc = y.coord(shown.iter().map(|p| p.y).chain(target.map(|t| t.y)));
    let (xr, yr) = (xc.range(), yc.range());
    let (x_labels, y_labels) = (xc.labels(x.unit), yc.labels(y.unit));
    // The points, and the target corner's far end (for the legend to avoid).
    let mut at: Vec<(f64, f64)> = shown.iter().map(|p| (p.x, p.y)).collect();
    at.extend(target.map(|_| (xr.end, yr.end)));
    render(fig, H, |root| {
        with_coord!(xc, |cx| with_coord!(yc, |cy| {
            let mut chart = frame(
                root,
                (cx, &x_labels, x.title()),
                (cy, &y_labels, y.title()),
                (BOTTOM, 0),
            )?;
            let shade = TARGET_GREEN.mix(0.10).filled();
            if let Some(t) = target {
                // Clipped to the plot area: the corner may lie outside the data's range.
                let (tx, ty) = (t.x.clamp(xr.start, xr.end), t.y.clamp(yr.start, yr.end));
                chart.draw_series([Rectangle::new([(tx, ty), (xr.end, yr.end)], shade)])?;
                let edge = [(tx, yr.end), (tx, ty), (xr.end, ty)];
                chart.draw_series(DashedLineSeries::new(edge, 6, 3, TARGET_GREEN.into()))?;
            }
            if let Some((x, _)) = mark {
                let grey = RGBColor(0x66, 0x66, 0x66).into();
                let line = [(x, yr.start), (x, yr.end)];
                chart.draw_series(DashedLineSeries::new(line, 3, 3, grey))?;
            }
            let (px, py) = chart.plotting_area().get_pixel_range();
            let f = f64::from;
            let area = (f(px.start), f(py.start), f(px.end), f(py.end));
            let pixel = |p: (f64, f64)| {
                let (a, b) = chart.backend_coord(&p);
                (f(a), f(b))
            };
            let mut taken: Vec<Box4> = shown
                .iter()
                .map(|p| pixel((p.x, p.y)))
                .map(|(x, y)| (x - 6.0, y - 6.0, x + 6.0, y + 6.0))
                .collect();
            if let Some((x, caption)) = mark {
                let (cx, cy) = (pixel((x, yr.start)).0 - 4.0, area.3 - 10.0);
                let style = text_style(font(11.0), &GREY, HPos::Right);
                root.draw(&Text::new(caption, (cx as i32, cy as i32), style))?;
                taken.push(text_box(caption, cx, cy, HPos::Right));
            }
            for (i, p) in shown.iter().enumerate() {
                let text = format!("{} {}", p.label, p.note);
                let text = text.trim_end();
                let (x, y) = pixel((p.x, p.y));
                let (lx, ly, anchor) = place(text, (x, y), &taken, area);
                taken.push(text_box(text, lx, ly, anchor));
                let to = |x: f64, y: f64| (x.round() as i32, y.round() as i32);
                if (lx - x).abs() > 20.0 || (ly - y).abs() > 22.0 {
                    let leader = RGBColor(0x99, 0x99, 0x99);
                    root.draw(&PathElement::new(vec![to(x, y), to(lx, ly)], leader))?;
                }
                let style = text_style(font(11.0), &color(i), anchor);
                root.draw(&Text::new(text, to(lx, ly), style))?;
            }
            // Each point is labelled beside itself, in its colour: the legend has only the
            // target's caption (a legend of every point covered the points it listed).
            for (i, p) in shown.iter().enumerate() {
                root.draw(&marker(i, chart.backend_coord(&(p.x, p.y))))?;
            }
            if let Some(t) = target {
                // The caption's first line beside a swatch of the shade, the others under it.
                for (k, caption) in t.caption.lines().enumerate() {
                    let entry = chart.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?;
                    entry.label(caption);
                    if k == 0 {
                        entry.legend(move |(x, y)| {
                            Rectangle::new([(x, y - 6), (x + 26, y + 6)], shade)
                        });
                    }
                }
            }
            finish(root, &mut chart, fig, &at)
        }))
    })
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

    /// The texts of an SVG's `<text>` elements (plotters writes each on a line of its own).
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text ")
            .skip(1)
            .filter_map(|t| t.split_once(">\n")?.1.split_once("\n</text>"))
            .map(|(text, _)| text)
            .collect()
    }

    /// The value of attribute `name` in the element `tag`.
    fn attr<'s>(tag: &'s str, name: &str) -> Option<&'s str> {
        tag.split(&format!(" {name}=\"")).nth(1)?.split('"').next()
    }

    /// The `<polyline` elements whose stroke is `color` ("#1F77B4") `width` pixels wide.
    fn polylines<'s>(svg: &'s str, color: &str, width: &str) -> Vec<&'s str> {
        svg.lines()
            .filter(|l| l.starts_with("<polyline") && attr(l, "stroke") == Some(color))
            .filter(|l| attr(l, "stroke-width") == Some(width))
            .collect()
    }

    fn log_lines(series: &[Series]) -> String {
        let x = Axis::log("size", Unit::Bytes);
        lines(
            &fig(false),
            &x,
            &Axis::log("time", Unit::Nanoseconds),
            series,
        )
    }

    #[test]
    fn svg_is_well_formed_and_says_what_and_where() {
        let svg = log_lines(&[Series::new("a <b>", vec![(4096.0, 2.0), (65536.0, 300.0)])]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        let t = texts(&svg);
        assert!(
            t.contains(&"a &lt;b&gt;") && t.contains(&"t"),
            "escaped: {t:?}"
        );
        assert!(t.contains(&"AMD EPYC, 2 cores; 2026-01-02"), "{t:?}");
        assert!(!svg.contains("SMOKE"), "{svg}");
        let b = bars(
            &fig(true),
            &["1".into(), "2".into()],
            &Axis::linear("rate", Unit::Count),
            &[("x".into(), vec![Some(1.0), None])],
        );
        assert!(b.starts_with("<svg") && b.trim_end().ends_with("</svg>"));
        // One bar and the legend's swatch: none for the category without a value.
        let filled = b
            .lines()
            .filter(|l| l.starts_with("<rect") && attr(l, "fill") == Some("#1F77B4"));
        assert_eq!(filled.count(), 2, "{b}");
        let t = texts(&b);
        assert!(
            t.contains(&SMOKE) && t.contains(&"SMOKE TEST"),
            "banner and watermark: {t:?}"
        );
        assert!(["1", "2", "x"].iter().all(|s| t.contains(s)), "{t:?}");
    }

    #[test]
    fn tick_labels_carry_the_unit_with_one_prefix_rule_per_axis() {
        let log = |unit: Unit, ticks: &[f64]| -> Vec<String> {
            ticks.iter().map(|&v| unit.label(v, None)).collect()
        };
        let ns = log(Unit::Nanoseconds, &[10.0, 100.0, 1e3, 1e4, 1e6, 1e9]);
        assert_eq!(ns, ["10 ns", "100 ns", "1 µs", "10 µs", "1 ms", "1 s"]);
        let b = log(
            Unit::Bytes,
            &[4096.0, 65536.0, 2.0 * 1048576.0, 1073741824.0],
        );
        assert_eq!(b, ["4 KiB", "64 KiB", "2 MiB", "1 GiB"]);
        let kb = log(Unit::Plain, &[100.0, 1e3, 1e4, 1e5, 1e6]);
        assert_eq!(kb, ["100", "1,000", "10,000", "100,000", "1,000,000"]);
        // Linear: the prefix of the largest tick and the decimals of the step, for all.
        let linear = |unit, top| {
            let f = Coord::Linear(0.0..top).labels(unit);
            [0.0, 0.5, 1.0, 1.5].map(|v| f(&(v * top / 1.5)))
        };
        assert_eq!(linear(Unit::Plain, 1.5), ["0", "0.5", "1.0", "1.5"]);
        assert_eq!(linear(Unit::Count, 120e3), ["0", "40 k", "80 k", "120 k"]);
    }

    #[test]
    fn the_axes_are_labelled_in_their_units_at_the_measured_sizes() {
        let sizes = [4096.0, 65536.0, 2.0 * 1048576.0];
        let svg = lines(
            &fig(false),
            &Axis::log("range size (bytes)", Unit::Bytes),
            &Axis::linear("pairs per second", Unit::Count),
            &[Series::new(
                "a",
                sizes.iter().map(|&s| (s, 117_000.0)).collect(),
            )],
        );
        let t = texts(&svg);
        for label in ["4 KiB", "64 KiB", "2 MiB", "0", "20 k", "120 k"] {
            assert!(t.contains(&label), "{label} in {t:?}");
        }
        // Only the measured sizes: no power of two between them.
        assert!(!t.contains(&"8 KiB") && !t.contains(&"1 MiB"), "{t:?}");
        assert!(t.contains(&"range size (bytes, log scale)"), "{t:?}");
        assert!(t.contains(&"pairs per second"), "{t:?}");
    }

    #[test]
    fn coinciding_series_stay_visible() {
        let same = vec![(4096.0, 80.0), (65536.0, 80.0)];
        let svg = log_lines(&[
            Series::new("managed", same.clone()),
            Series::new("hybrid", same),
        ]);
        // The first solid and wider underneath, the second dashed: their lines and legend
        // samples in one piece each and in many.
        let (first, second) = (
            polylines(&svg, "#1F77B4", "5"),
            polylines(&svg, "#D62728", "4"),
        );
        assert_eq!(first.len(), 2, "{svg}");
        assert!(second.len() > 10, "{svg}");
        // Hollow markers of different shapes (a circle, a square), over every line: each point's
        // and the legend's.
        let points = |l: &str| attr(l, "points").unwrap().split_whitespace().count();
        let circles = polylines(&svg, "#1F77B4", "2");
        let squares = polylines(&svg, "#D62728", "2");
        assert_eq!(
            circles.iter().map(|l| points(l)).collect::<Vec<_>>(),
            [17; 3]
        );
        assert_eq!(
            squares.iter().map(|l| points(l)).collect::<Vec<_>>(),
            [5; 3]
        );
        let (lines, markers) = svg.split_at(svg.find(circles[0]).unwrap());
        assert!(
            lines.contains(first[0]) && lines.contains(second[10]),
            "{svg}"
        );
        assert!(markers.contains(squares[1]) && !svg.contains("fill=\"#D62728\""));
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
        let target = Target {
            x: 12.0,
            y: 900.0,
            caption: "target\nsecond line".into(),
        };
        let svg = scatter(
            &fig(true),
            &Axis::linear("returned (MiB)", Unit::Plain),
            &Axis::linear("ops/s", Unit::Count),
            &points,
            Some(&target),
            Some((13.0, "all")),
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let t = texts(&svg);
        let count = |s: &str| t.iter().filter(|t| **t == s).count();
        // Each label once, beside its point (the first with its note); not in the legend.
        assert_eq!(count("p0 &lt;x&gt; (note)"), 1, "{t:?}");
        assert_eq!(svg.matches("(note)").count(), 1, "{t:?}");
        for i in 1..4 {
            assert_eq!(count(&format!("p{i} &lt;x&gt;")), 1, "{t:?}");
        }
        for s in ["target", "second line", "all", SMOKE] {
            assert_eq!(count(s), 1, "{s} in {t:?}");
        }
        // The shaded corner: from x = 12 to the plot area's right edge, within the plot area;
        // and its swatch in the legend.
        let shades: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<rect") && attr(l, "fill") == Some("#2CA02C"))
            .collect();
        assert_eq!(shades.len(), 2, "{svg}");
        let num = |name| attr(shades[0], name).unwrap().parse::<u32>().unwrap();
        let (x, y, w, h) = (num("x"), num("y"), num("width"), num("height"));
        assert_eq!(attr(shades[0], "opacity"), Some("0.1"));
        assert!(
            (x + w).abs_diff(W - RIGHT) <= 1 && y == TOP,
            "{}",
            shades[0]
        );
        assert!(
            x > LEFT + (W - LEFT - RIGHT) / 2 && h > 0 && y + h < H - BOTTOM,
            "{}",
            shades[0]
        );
    }

    #[test]
    fn long_category_labels_are_written_upwards_and_short_ones_across() {
        let upwards = |categories: Vec<String>| {
            let values = vec![Some(1.0); categories.len()];
            let svg = bars(
                &fig(false),
                &categories,
                &Axis::log("reads/s", Unit::Plain),
                &[("r".into(), values)],
            );
            let rotated = svg.lines().filter(|l| l.contains("rotate(270"));
            let rotated: Vec<String> = rotated
                .map(|l| attr(l, "text-anchor").unwrap().into())
                .collect();
            assert!(texts(&svg).contains(&categories[0].as_str()), "{svg}");
            rotated
        };
        let few = ["ordinary memory", "b", "c", "d"]
            .map(String::from)
            .to_vec();
        assert_eq!(upwards(few), ["middle"], "only the y axis's title");
        let many = (0..12)
            .map(|i| format!("vrange-malloc{i} huge chunks"))
            .collect();
        let rotated = upwards(many);
        assert_eq!(rotated.len(), 13, "{rotated:?}");
        assert_eq!(
            rotated.iter().filter(|a| **a == "end").count(),
            12,
            "ending under the axis"
        );
    }
}
