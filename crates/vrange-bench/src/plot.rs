//! The suites' SVG plots: lines (numeric x, linear or log axes), grouped bars and labelled
//! points (scatter). Enough to see a suite's shape at a glance; the numbers are in the tables
//! and CSV files.
//!
//! `plotters` draws them (its SVG backend, into a `String`; no font library: the SVG viewer
//! lays the text out). What this module adds is the choices a figure needs to be read right:
//!
//! - Every figure says what it shows and where it was measured: a title, a line with the
//!   machine and the date, and for `--quick` runs a "SMOKE TEST" banner and a watermark over
//!   the data, so a smoke run's plot is never mistaken for a measurement.
//! - Tick labels carry the axis unit with one prefix rule per axis (`4 KiB`, `2 MiB`; `10 ns`,
//!   `1 µs`; `0, 20 k, ..., 120 k`): the axes are a coordinate of our own ([`Scale`]) whose
//!   ticks are powers of the unit's base on a log axis (the measured values themselves where a
//!   log x axis has few), and a log axis's title says so.
//! - Every series stays visible when series coincide (managed and hybrid mark costs are the
//!   same line): each has its own colour, hollow marker shape and dash pattern, earlier series
//!   are drawn wider underneath later ones, and markers are drawn over all the lines.
//! - A scatter plot's points are labelled beside them where the label covers no other label
//!   or marker, and its target corner is shaded.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::element::{DashedPathElement, Drawable, PointCollection};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{BackendCoord, DrawingErrorKind};
use std::ops::Range;

const W: u32 = 820;
const H: u32 = 500;
/// The y axis's labels and title, left of the plot area.
const LEFT: u32 = 84;
/// The legend, right of the plot area.
const RIGHT: u32 = 220;
/// The title, the machine line and the smoke-test banner.
const TOP: u32 = 76;
/// The x axis's labels and title.
const BOTTOM: u32 = 50;
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];
/// Dash patterns (dash, gap in pixels), by series: solid first (ours, in the suites), then
/// patterns that let a line underneath show through.
const DASHES: [Option<(u32, u32)>; 6] = [
    None,
    Some((10, 4)),
    Some((3, 3)),
    Some((18, 5)),
    Some((6, 2)),
    Some((2, 5)),
];
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

/// An axis's coordinate, for plotters: its range, linear or logarithmic, and its ticks (the
/// grid lines) with their labels in the axis's unit.
#[derive(Clone)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<f64>,
    labels: Vec<String>,
    unit: Unit,
}

impl Scale {
    /// The axis over `values`: from powers of the unit's base around them on a log axis, from 0
    /// (or below) to a little above the largest on a linear one.
    fn new(values: impl Iterator<Item = f64>, axis: &Axis) -> Scale {
        let log = axis.log;
        let base = axis.unit.base();
        let (mut lo, mut hi) = values
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
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
        let ticks = if log {
            // Powers of the base, every few if there are many.
            let (a, b) = (lo.log(base).round() as i32, hi.log(base).round() as i32);
            let step = ((b - a) as f64 / 9.0).ceil().max(1.0) as usize;
            (a..=b).step_by(step).map(|e| base.powi(e)).collect()
        } else {
            // Multiples of 1, 2 or 5 times a power of ten.
            let span = hi - lo;
            let mag = 10f64.powf((span / 6.0).log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| span / s <= 8.0)
                .unwrap_or(mag * 10.0);
            let mut v = Vec::new();
            let mut k = (lo / step).ceil();
            while k * step <= hi + step * 1e-9 {
                v.push(k * step);
                k += 1.0;
            }
            v
        };
        Scale::spanning(lo, hi, ticks, axis)
    }

    /// From `lo` to `hi` with grid lines and labels at `ticks`.
    fn spanning(lo: f64, hi: f64, ticks: Vec<f64>, axis: &Axis) -> Scale {
        Scale {
            lo,
            hi,
            log: axis.log,
            labels: axis.unit.labels(&ticks, axis.log),
            ticks,
            unit: axis.unit,
        }
    }

    /// Where `v` lies between the ends: 0 at `lo`, 1 at `hi`.
    fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    /// The label of tick `v` (of any value: with its own prefix).
    fn label(&self, v: f64) -> String {
        match self.ticks.iter().position(|t| t.to_bits() == v.to_bits()) {
            Some(i) => self.labels[i].clone(),
            None => self.unit.labels(&[v], true).remove(0),
        }
    }
}

impl Ranged for Scale {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (a, b) = (f64::from(limit.0), f64::from(limit.1));
        (a + self.fraction(*v) * (b - a)).round() as i32
    }

    /// Our ticks, as the bold grid lines that plotters labels; no light lines between them.
    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

type Area<'s> = DrawingArea<SVGBackend<'s>, Shift>;
type Chart<'a, 's> = ChartContext<'a, SVGBackend<'s>, Cartesian2d<Scale, Scale>>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Text of `px` pixels: plotters writes font-size = size / 1.24 (the sizes used here come
/// back whole: "16", not "15.000000000000002").
fn font(px: f64) -> FontDesc<'static> {
    FontDesc::new(FontFamily::SansSerif, px * 1.24, FontStyle::Normal)
}

/// `font` in `color`, anchored at its `h` side and its vertical middle.
fn text_style(font: &FontDesc<'static>, color: &RGBColor, h: HPos) -> TextStyle<'static> {
    font.color(color).pos(Pos::new(h, VPos::Center))
}

/// A figure `height` pixels high: its frame (title, machine, smoke banner) and what `draw`
/// draws in it, as an SVG document. Drawing into a String fails only by a bug; a figure that
/// failed says so in itself rather than failing the suite that measured it.
fn render(fig: &Figure, height: u32, draw: impl FnOnce(&Area) -> Drawn) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, height)).into_drawing_area();
        let drawn = root
            .fill(&WHITE)
            .and_then(|()| header(&root, fig))
            .and_then(|()| draw(&root));
        if let Err(e) = drawn {
            let style = text_style(&font(14.0), &SMOKE_RED, HPos::Center);
            let at = ((W / 2) as i32, (height / 2) as i32);
            let _ = root.draw(&Text::new(format!("plot failed: {e}"), at, style));
        }
        let _ = root.present();
    }
    svg
}

/// The title, the machine and date, and the smoke-test banner.
fn header(root: &Area, fig: &Figure) -> Drawn {
    let mid = (W / 2) as i32;
    let bold = |px| font(px).style(FontStyle::Bold);
    let title = text_style(&bold(16.0), &BLACK, HPos::Center);
    root.draw(&Text::new(fig.title.as_str(), (mid, 18), title))?;
    let about = text_style(&font(11.0), &GREY, HPos::Center);
    root.draw(&Text::new(fig.about.as_str(), (mid, 37), about))?;
    if fig.smoke {
        let banner = text_style(&bold(14.0), &SMOKE_RED, HPos::Center);
        root.draw(&Text::new(SMOKE, (mid, 57), banner))?;
    }
    Ok(())
}

/// The chart in `root` over `x` and `y` with `bottom` pixels under it for the x axis: the
/// grid at the scales' ticks, their labels, the axis titles and the plot area's frame.
fn frame<'a, 's>(
    root: &'a Area<'s>,
    (x, x_title): (Scale, Option<String>),
    (y, y_title): (Scale, String),
    bottom: u32,
) -> Result<Chart<'a, 's>, DrawingAreaErrorKind<std::io::Error>> {
    let mut chart = ChartBuilder::on(root)
        .margin_top(TOP)
        .margin_right(RIGHT)
        .x_label_area_size(bottom)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(x.clone(), y.clone())?;
    let label_x = |v: &f64| x.label(*v);
    let label_y = |v: &f64| y.label(*v);
    let grid = RGBColor(0xe2, 0xe2, 0xe2);
    let mut mesh = chart.configure_mesh();
    mesh.bold_line_style(grid)
        .axis_style(BLACK)
        .set_all_tick_mark_size(4)
        .label_style(font(12.0))
        .axis_desc_style(font(12.0))
        .x_label_formatter(&label_x)
        .y_label_formatter(&label_y)
        .y_desc(y_title);
    if let Some(title) = x_title {
        mesh.x_desc(title);
    }
    mesh.draw()?;
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    root.draw(&Rectangle::new(
        [(xs.start, ys.start), (xs.end, ys.end)],
        BLACK,
    ))?;
    Ok(chart)
}

/// What a legend line shows beside its text.
enum Key<'t> {
    /// A line series: a piece of its line with its marker.
    Line(Style, &'t str),
    /// A series of bars: a swatch of their colour.
    Bar(RGBColor, &'t str),
    /// A scatter plot's point: its marker.
    Point(Style, &'t str),
    /// A scatter plot's target corner: a swatch of its shade, and its caption's lines.
    Target(&'t str),
}

/// What every chart ends with: a smoke test's watermark across the plot area (over the data,
/// faint enough to read the data through it), and the legend right of the plot area (drawn
/// here: plotters' own legend is kept within the plot area, over the data).
fn finish(root: &Area, chart: &Chart, fig: &Figure, keys: &[Key]) -> Drawn {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    if fig.smoke {
        let mark = font(56.0).style(FontStyle::Bold);
        let mark = mark.color(&SMOKE_RED.mix(0.12));
        let at = ((xs.start + xs.end) / 2, (ys.start + ys.end) / 2);
        let style = mark.pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new("SMOKE TEST", at, style))?;
    }
    let x = xs.end + 12;
    let mut y = ys.start + 10;
    let label = text_style(&font(12.0), &BLACK, HPos::Left);
    for key in keys {
        let text = match *key {
            Key::Line(style, text) => {
                let line = [(x, y), (x + 26, y)];
                match style.dash {
                    None => root.draw(&PathElement::new(line, style.line()))?,
                    Some((on, off)) => {
                        root.draw(&DashedPathElement::new(line, on, off, style.line()))?;
                    }
                }
                root.draw(&style.marker((x + 13, y)))?;
                text
            }
            Key::Bar(color, text) => {
                root.draw(&Rectangle::new(
                    [(x, y - 6), (x + 26, y + 6)],
                    color.filled(),
                ))?;
                text
            }
            Key::Point(style, text) => {
                root.draw(&style.marker((x + 13, y)))?;
                text
            }
            Key::Target(caption) => {
                y += 4;
                shade(root, (x, y - 6), (x + 26, y + 6))?;
                let green = text_style(&font(12.0), &RGBColor(0x1a, 0x6e, 0x1a), HPos::Left);
                for line in caption.lines() {
                    root.draw(&Text::new(line, (x + 34, y), green.clone()))?;
                    y += 15;
                }
                continue;
            }
        };
        root.draw(&Text::new(text, (x + 34, y), label.clone()))?;
        y += 20;
    }
    Ok(())
}

/// The target corner's shade over the pixels from `a` to `b`, edged with a dashed line.
fn shade(root: &Area, a: (i32, i32), b: (i32, i32)) -> Drawn {
    root.draw(&Rectangle::new([a, b], TARGET_GREEN.mix(0.10).filled()))?;
    let edge = vec![a, (b.0, a.1), b, (a.0, b.1), a];
    root.draw(&DashedPathElement::new(
        edge,
        6,
        3,
        TARGET_GREEN.stroke_width(1),
    ))
}

/// How series `i` is drawn.
#[derive(Clone, Copy)]
struct Style {
    color: RGBColor,
    dash: Option<(u32, u32)>,
    width: u32,
    marker: usize,
    size: i32,
}

/// The number of marker shapes: circle, square, triangle, diamond, inverted triangle, ×, +.
const MARKERS: usize = 7;

impl Style {
    fn of(i: usize) -> Style {
        Style {
            color: COLORS[i % COLORS.len()],
            dash: DASHES[i % DASHES.len()],
            // Wider first: a later series on the same values leaves an edge of it showing.
            width: [5, 4, 3, 2][i.min(3)],
            marker: i % MARKERS,
            // Smaller later, to fit inside an earlier marker at the same point.
            size: [6, 6, 5, 5, 4, 4, 3][i.min(6)],
        }
    }

    fn line(&self) -> ShapeStyle {
        self.color.mix(0.85).stroke_width(self.width)
    }

    /// The marker at `at`.
    fn marker<C>(self, at: C) -> Marker<C> {
        Marker { at, style: self }
    }
}

/// A series' marker, an element plotters draws at a point: hollow (a faint white inside), so
/// markers at one point do not cover each other.
struct Marker<C> {
    at: C,
    style: Style,
}

impl<'a, C> PointCollection<'a, C> for &'a Marker<C> {
    type Point = &'a C;
    type IntoIter = std::iter::Once<&'a C>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<C, DB: DrawingBackend> Drawable<DB> for Marker<C> {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut pos: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((x, y)) = pos.next() else {
            return Ok(());
        };
        let r = self.style.size;
        let f = f64::from(r);
        let p = |dx: f64, dy: f64| (x + (dx * f).round() as i32, y + (dy * f).round() as i32);
        let inside = WHITE.mix(0.6).filled();
        let edge = self.style.color.stroke_width(2);
        let mut polygon = |points: Vec<(i32, i32)>| {
            backend.fill_polygon(points.iter().copied(), &inside)?;
            backend.draw_path(points.iter().chain(points.first()).copied(), &edge)
        };
        match self.style.marker {
            0 => {
                let r = r.unsigned_abs();
                backend.draw_circle((x, y), r, &inside, true)?;
                backend.draw_circle((x, y), r, &edge, false)
            }
            1 => polygon(vec![
                p(-0.85, -0.85),
                p(0.85, -0.85),
                p(0.85, 0.85),
                p(-0.85, 0.85),
            ]),
            2 => polygon(vec![p(0.0, -1.0), p(1.0, 0.8), p(-1.0, 0.8)]),
            3 => polygon(vec![p(0.0, -1.2), p(1.0, 0.0), p(0.0, 1.2), p(-1.0, 0.0)]),
            4 => polygon(vec![p(0.0, 1.0), p(1.0, -0.8), p(-1.0, -0.8)]),
            5 => {
                backend.draw_path([p(-1.0, -1.0), p(1.0, 1.0)], &edge)?;
                backend.draw_path([p(-1.0, 1.0), p(1.0, -1.0)], &edge)
            }
            _ => {
                backend.draw_path([p(-1.2, 0.0), p(1.2, 0.0)], &edge)?;
                backend.draw_path([p(0.0, -1.2), p(0.0, 1.2)], &edge)
            }
        }
    }
}

/// A line plot of `series` against numeric x values.
pub fn lines(fig: &Figure, x: &Axis, y: &Axis, series: &[Series]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let mut xs = Scale::new(all().map(|p| p.0), x);
    // A log axis over a few sizes is labelled at the sizes themselves.
    let mut xvals: Vec<f64> = all()
        .map(|p| p.0)
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    xvals.sort_by(f64::total_cmp);
    xvals.dedup();
    if x.log && !xvals.is_empty() && xvals.len() <= 12 {
        let (lo, hi) = (xvals[0] / 1.25, xvals[xvals.len() - 1] * 1.25);
        xs = Scale::spanning(lo, hi, xvals, x);
    }
    let ys = Scale::new(all().map(|p| p.1), y);
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
    render(fig, H, |root| {
        let mut chart = frame(root, (xs, Some(x.title())), (ys, y.title()), BOTTOM)?;
        // Every line first, widest first; then every marker, so none hides under a line.
        for (i, pts) in drawn.iter().enumerate() {
            let style = Style::of(i);
            let points = pts.iter().copied();
            match style.dash {
                None => chart.draw_series(LineSeries::new(points, style.line()))?,
                Some((on, off)) => {
                    chart.draw_series(DashedLineSeries::new(points, on, off, style.line()))?
                }
            };
        }
        for (i, pts) in drawn.iter().enumerate() {
            // Long series get a marker every `every` points, each series at its own phase so
            // that series running together still show each one's markers.
            let every = pts.len().div_ceil(15).max(1);
            let phase = i * every / series.len().max(1);
            let last = pts.len().saturating_sub(1);
            let style = Style::of(i);
            chart.draw_series(
                pts.iter()
                    .enumerate()
                    .filter(|&(j, _)| (j + phase) % every == 0 || j == last)
                    .map(|(_, &p)| style.marker(p)),
            )?;
        }
        let keys: Vec<Key> = series
            .iter()
            .enumerate()
            .map(|(i, ser)| Key::Line(Style::of(i), &ser.name))
            .collect();
        finish(root, &chart, fig, &keys)
    })
}

/// The width of a character of 12-pixel sans-serif text, roughly.
const CHAR: f64 = 6.6;

/// The categories' labels in lines as wide as a group of bars (`group` pixels), split at
/// spaces, at most three lines each; `None` where a label does not fit so.
fn wrapped(categories: &[String], group: f64) -> Option<Vec<Vec<String>>> {
    let chars = ((group - 6.0) / CHAR).floor().max(1.0) as usize;
    categories
        .iter()
        .map(|c| {
            let mut lines: Vec<String> = Vec::new();
            for word in c.split_whitespace() {
                match lines.last_mut() {
                    Some(l) if l.chars().count() + 1 + word.chars().count() <= chars => {
                        l.push(' ');
                        l.push_str(word);
                    }
                    _ => lines.push(word.to_string()),
                }
            }
            let fits = lines.len() <= 3 && lines.iter().all(|l| l.chars().count() <= chars);
            fits.then_some(lines)
        })
        .collect()
}

/// Grouped bars: one group per category, one bar per series (`None`: no bar). A category's
/// label is written under its group, in lines as wide as the group, or, where labels do not
/// fit so (many categories), all upwards.
pub fn bars(
    fig: &Figure,
    categories: &[String],
    y: &Axis,
    series: &[(String, Vec<Option<f64>>)],
) -> String {
    let ys = Scale::new(
        series.iter().flat_map(|(_, v)| v.iter().flatten().copied()),
        y,
    );
    let n = categories.len().max(1) as f64;
    let xs = Scale::spanning(0.0, n, Vec::new(), &Axis::linear("", Unit::Plain));
    let across = wrapped(categories, f64::from(W - LEFT - RIGHT) / n);
    // Room under the plot area for the labels; the plot area keeps its height.
    let bottom = match &across {
        Some(lines) => 14 + 15 * lines.iter().map(Vec::len).max().unwrap_or(1) as u32,
        None => {
            let longest = categories.iter().map(|c| c.chars().count()).max();
            16 + (CHAR * longest.unwrap_or(0) as f64).ceil() as u32
        }
    }
    .max(BOTTOM);
    render(fig, H - BOTTOM + bottom, |root| {
        let mut chart = frame(root, (xs, None), (ys.clone(), y.title()), bottom)?;
        let base = if y.log { ys.lo } else { ys.lo.max(0.0) };
        let bar = 0.8 / series.len().max(1) as f64;
        for (k, (_, values)) in series.iter().enumerate() {
            let color = Style::of(k).color;
            let left = |c: usize| c as f64 + 0.1 + k as f64 * bar;
            let bars = values.iter().take(categories.len()).enumerate();
            let bars = bars.filter_map(|(c, v)| {
                let v = v.filter(|v| v.is_finite() && (!y.log || *v > 0.0))?;
                let corners = [(left(c), base), (left(c) + bar, v)];
                Some(Rectangle::new(corners, color.filled()))
            });
            chart.draw_series(bars)?;
        }
        let (_, plot) = chart.plotting_area().get_pixel_range();
        let font = font(12.0);
        for (c, cat) in categories.iter().enumerate() {
            let (cx, _) = chart.backend_coord(&(c as f64 + 0.5, base));
            match &across {
                Some(lines) => {
                    for (k, line) in lines[c].iter().enumerate() {
                        let at = (cx, plot.end + 14 + 15 * k as i32);
                        let style = text_style(&font, &BLACK, HPos::Center);
                        root.draw(&Text::new(line.as_str(), at, style))?;
                    }
                }
                None => {
                    let upwards = font.transform(FontTransform::Rotate270);
                    let style = text_style(&upwards, &BLACK, HPos::Right);
                    root.draw(&Text::new(cat.as_str(), (cx, plot.end + 8), style))?;
                }
            }
        }
        let keys: Vec<Key> = series
            .iter()
            .enumerate()
            .map(|(k, (name, _))| Key::Bar(Style::of(k).color, name))
            .collect();
        finish(root, &chart, fig, &keys)
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
/// captioned under the legend (inside the plot the caption would cover points); `caption`'s
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
        for (dx, dy, anchor) in [
            (9.0, 0.0, HPos::Left),
            (-9.0, 0.0, HPos::Right),
            (0.0, -14.0, HPos::Center),
            (0.0, 14.0, HPos::Center),
            (9.0, -12.0, HPos::Left),
            (-9.0, -12.0, HPos::Right),
            (9.0, 12.0, HPos::Left),
            (-9.0, 12.0, HPos::Right),
        ] {
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
    );
    let ys = Scale::new(shown.iter().map(|p| p.y).chain(corner.map(|c| c.1)), y);
    render(fig, H, |root| {
        let mut chart = frame(root, (xs, Some(x.title())), (ys, y.title()), BOTTOM)?;
        let (px, py) = chart.plotting_area().get_pixel_range();
        let area = (
            f64::from(px.start),
            f64::from(py.start),
            f64::from(px.end),
            f64::from(py.end),
        );
        let pixel = |x: f64, y: f64| {
            let (a, b) = chart.backend_coord(&(x, y));
            (f64::from(a), f64::from(b))
        };
        let at: Vec<(f64, f64)> = shown.iter().map(|p| pixel(p.x, p.y)).collect();
        let corner = corner.map(|(x, y)| pixel(x, y));
        let mark_at = mark.map(|(x, caption)| (pixel(x, 1.0).0, caption));
        if let Some((left, bottom)) = corner {
            // Clipped to the plot area: the corner may lie outside the data's range.
            let left = left.clamp(area.0, area.2) as i32;
            let bottom = bottom.clamp(area.1, area.3) as i32;
            shade(root, (left, py.start), (px.end, bottom))?;
        }
        let mut taken: Vec<Box4> = at
            .iter()
            .map(|&(x, y)| (x - 6.0, y - 6.0, x + 6.0, y + 6.0))
            .collect();
        let small = font(11.0);
        if let Some((x, caption)) = mark_at {
            let x = x.round() as i32;
            let line = vec![(x, py.start), (x, py.end)];
            let grey = RGBColor(0x66, 0x66, 0x66).stroke_width(1);
            root.draw(&DashedPathElement::new(line, 3, 3, grey))?;
            let (cx, cy) = (x - 4, py.end - 10);
            let style = text_style(&small, &GREY, HPos::Right);
            root.draw(&Text::new(caption, (cx, cy), style))?;
            taken.push(text_box(caption, f64::from(cx), f64::from(cy), HPos::Right));
        }
        for (i, (p, &(x, y))) in shown.iter().zip(&at).enumerate() {
            let text = if p.note.is_empty() {
                p.label.clone()
            } else {
                format!("{} {}", p.label, p.note)
            };
            let (lx, ly, anchor) = place(&text, (x, y), &taken, area);
            taken.push(text_box(&text, lx, ly, anchor));
            let to = |x: f64, y: f64| (x.round() as i32, y.round() as i32);
            if (lx - x).abs() > 20.0 || (ly - y).abs() > 22.0 {
                let leader = RGBColor(0x99, 0x99, 0x99).stroke_width(1);
                root.draw(&PathElement::new(vec![to(x, y), to(lx, ly)], leader))?;
            }
            let style = text_style(&small, &Style::of(i).color, anchor);
            root.draw(&Text::new(text, to(lx, ly), style))?;
        }
        chart.draw_series(
            shown
                .iter()
                .enumerate()
                .map(|(i, p)| Style::of(i).marker((p.x, p.y))),
        )?;
        let mut keys: Vec<Key> = shown
            .iter()
            .enumerate()
            .map(|(i, p)| Key::Point(Style::of(i), &p.label))
            .collect();
        keys.extend(target.map(|t| Key::Target(&t.caption)));
        finish(root, &chart, fig, &keys)
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

    /// The `<polyline` elements whose stroke is `color` ("#1F77B4").
    fn polylines<'s>(svg: &'s str, color: &str) -> Vec<&'s str> {
        svg.lines()
            .filter(|l| l.starts_with("<polyline") && attr(l, "stroke") == Some(color))
            .collect()
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
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert_eq!(
            polylines(&svg, "#1F77B4").len(),
            2,
            "the line and its legend sample"
        );
        let t = texts(&svg);
        assert!(t.contains(&"a &lt;b&gt;"), "escaped: {t:?}");
        assert!(t.contains(&"AMD EPYC, 2 cores; 2026-01-02"), "{t:?}");
        assert!(!svg.contains("SMOKE"), "{svg}");
        let b = bars(
            &fig(true),
            &["1".into(), "2".into()],
            &Axis::linear("rate", Unit::Count),
            &[("x".into(), vec![Some(1.0), None])],
        );
        assert!(b.starts_with("<svg") && b.trim_end().ends_with("</svg>"));
        // One bar and one legend swatch: none for the category without a value.
        let filled = b
            .lines()
            .filter(|l| l.starts_with("<rect") && attr(l, "fill") == Some("#1F77B4"));
        assert_eq!(filled.count(), 2, "{b}");
        let t = texts(&b);
        assert!(
            t.contains(&SMOKE) && t.contains(&"SMOKE TEST"),
            "banner and watermark: {t:?}"
        );
        assert!(
            t.contains(&"1") && t.contains(&"2") && t.contains(&"x"),
            "{t:?}"
        );
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
        );
        let labels = &s.labels;
        assert_eq!(labels[0], "0");
        assert!(labels[1..].iter().all(|l| l.ends_with(" k")), "{labels:?}");
        assert!(labels.iter().all(|l| !l.contains('.')), "{labels:?}");
        assert_eq!(
            Unit::Plain.labels(&[0.0, 0.5, 1.0, 1.5], false),
            ["0", "0.5", "1.0", "1.5"]
        );
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
        let svg = lines(
            &fig(false),
            &Axis::log("size", Unit::Bytes),
            &Axis::log("time", Unit::Nanoseconds),
            &[
                Series::new("managed", same.clone()),
                Series::new("hybrid", same),
            ],
        );
        let (first, second) = (polylines(&svg, "#1F77B4"), polylines(&svg, "#D62728"));
        let width = |l: &str| attr(l, "stroke-width").unwrap().parse::<u32>().unwrap();
        assert!(
            width(first[0]) > width(second[0]),
            "the first is wider, drawn under: {first:?} {second:?}"
        );
        // The second is dashed: its line and its legend sample in many pieces.
        assert_eq!(first.len(), 2, "solid: {first:?}");
        assert!(second.len() > 10, "dashed: {second:?}");
        // Distinct hollow markers: a circle and a square.
        let circle = svg.find("<circle").expect("a circle marker");
        assert!(svg[circle..].contains(r##"stroke="#1F77B4""##));
        let square = svg
            .lines()
            .find(|l| {
                l.starts_with("<polyline") && attr(l, "stroke") == Some("#D62728") && width(l) == 2
            })
            .expect("a square's edge");
        assert_eq!(
            attr(square, "points").unwrap().split_whitespace().count(),
            5
        );
        // Every line in the plot area comes before the first marker (the legend's samples,
        // right of the plot area, come after).
        let in_plot = |l: &str| {
            let x = attr(l, "points").unwrap().split(',').next().unwrap();
            x.parse::<u32>().unwrap() < W - RIGHT
        };
        let (before, after) = svg.split_at(circle);
        let lines_after = after
            .lines()
            .filter(|l| l.starts_with("<polyline") && width(l) > 2 && in_plot(l))
            .count();
        assert_eq!(lines_after, 0, "{svg}");
        assert!(polylines(before, "#D62728").len() > 5, "{svg}");
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
        // Each label twice: beside its point (the first with its note) and in the legend.
        assert_eq!(
            t.iter().filter(|s| **s == "p0 &lt;x&gt;").count(),
            1,
            "{t:?}"
        );
        assert_eq!(
            t.iter().filter(|s| **s == "p0 &lt;x&gt; (note)").count(),
            1,
            "{t:?}"
        );
        for i in 1..4 {
            let label = format!("p{i} &lt;x&gt;");
            assert_eq!(t.iter().filter(|s| **s == label).count(), 2, "{t:?}");
        }
        assert_eq!(
            svg.matches("(note)").count(),
            1,
            "a note is not in the legend"
        );
        assert!(t.contains(&"target") && t.contains(&"second line"), "{t:?}");
        assert!(t.contains(&"all"), "{t:?}");
        assert!(t.contains(&SMOKE), "{t:?}");
        // The shaded corner: from x = 12 to the plot area's right edge, within the plot area.
        let shade = svg
            .lines()
            .find(|l| l.starts_with("<rect") && attr(l, "fill") == Some("#2CA02C"))
            .expect("the shaded corner");
        assert_eq!(attr(shade, "opacity"), Some("0.1"));
        let num = |name| attr(shade, name).unwrap().parse::<i32>().unwrap();
        let (x, y, w, h) = (num("x"), num("y"), num("width"), num("height"));
        let right = i32::try_from(W - RIGHT).unwrap();
        assert_eq!(x + w, right, "{shade}");
        assert_eq!(y, i32::try_from(TOP).unwrap(), "{shade}");
        assert!(
            x > i32::try_from(LEFT).unwrap() && h > 0 && y + h < 500,
            "{shade}"
        );
    }

    #[test]
    fn many_categories_are_written_upwards_and_few_across() {
        let few: Vec<String> = ["decompress all into ordinary memory", "b", "c", "d"]
            .map(String::from)
            .to_vec();
        let svg = bars(
            &fig(false),
            &few,
            &Axis::log("reads/s", Unit::Plain),
            &[("r".into(), vec![Some(1e5), Some(2e6), None, Some(3.0)])],
        );
        let t = texts(&svg);
        for line in ["decompress all", "into ordinary", "memory", "b"] {
            assert!(t.contains(&line), "wrapped: {line} in {t:?}");
        }
        assert_eq!(
            svg.matches("rotate(270").count(),
            1,
            "the y axis's title: {svg}"
        );
        let many: Vec<String> = (0..12)
            .map(|i| format!("vrange-malloc{i} huge chunks"))
            .collect();
        let values = vec![Some(1.0); 12];
        let svg = bars(
            &fig(false),
            &many,
            &Axis::linear("r", Unit::Count),
            &[("r".into(), values)],
        );
        assert_eq!(svg.matches("rotate(270").count(), 13, "{svg}");
        let t = texts(&svg);
        assert!(t.contains(&"vrange-malloc0 huge chunks"), "{t:?}");
    }
}
