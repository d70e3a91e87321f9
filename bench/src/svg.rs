//! Two kinds of plot, written as SVG by hand (no font or plotting library: a few hundred
//! bytes of markup per series, and nothing more to compile): latency CDFs on a log axis, and
//! grouped bars.

use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// Distinct colours for up to 12 series.
pub const COLORS: [&str; 12] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
    "#1f78b4", "#b2df8a", "#fb9a99", "#000000",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="25" font-size="15" text-anchor="middle">{}</text>
"#,
        LEFT + (W - LEFT - RIGHT) / 2.0,
        esc(title)
    );
}

fn legend(out: &mut String, entries: &[(String, &str, bool)]) {
    for (i, (label, color, dashed)) in entries.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = W - RIGHT + 15.0;
        let dash = if *dashed {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="3"{dash}/><text x="{}" y="{}">{}</text>"#,
            x + 25.0,
            x + 32.0,
            y + 4.0,
            esc(label)
        );
    }
}

/// One CDF series: label, colour, dashed, and (latency µs, cumulative fraction) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// Latency CDFs, x on a log scale (µs), y the fraction of checks at or below.
pub fn cdf(title: &str, series: &[Series]) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let lo = 10f64.powf(lo.max(1.0).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()) * pw;
    let py = |y: f64| TOP + (1.0 - y) * ph;
    // Grid and axes.
    let mut d = lo;
    while d <= hi * 1.0001 {
        let x = px(d);
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            if d >= 1000.0 {
                format!("{} ms", d / 1000.0)
            } else {
                format!("{d} µs")
            }
        );
        d *= 10.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
        let y = py(q);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{q}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">latency per check (log scale)</text>
<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">fraction of checks ≤ x</text>"#,
        LEFT + pw / 2.0,
        H - 15.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            s.color,
            pts.join(" ")
        );
    }
    let entries: Vec<_> = series
        .iter()
        .map(|s| (s.label.clone(), s.color, s.dashed))
        .collect();
    legend(&mut out, &entries);
    out.push_str("</svg>\n");
    out
}

/// Grouped bars: one group per `groups` entry, one bar per series in each group.
pub fn bars(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, &str, Vec<f64>)],
) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let max = series
        .iter()
        .flat_map(|s| s.2.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    // A round top for the axis.
    let mag = 10f64.powf(max.log10().floor());
    let top = (max / mag).ceil() * mag;
    let py = |v: f64| TOP + (1.0 - v / top) * ph;
    for i in 0..=5 {
        let v = top * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            crate::report::num(v)
        );
    }
    let gw = pw / groups.len().max(1) as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let gx = LEFT + g as f64 * gw + gw * 0.1;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            gx + gw * 0.4,
            TOP + ph + 18.0,
            esc(name)
        );
        for (s, (_, color, vals)) in series.iter().enumerate() {
            let v = vals.get(g).copied().unwrap_or(f64::NAN);
            if !v.is_finite() {
                continue;
            }
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                gx + s as f64 * bw,
                py(v),
                bw * 0.9,
                TOP + ph - py(v)
            );
        }
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>
<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    let entries: Vec<_> = series.iter().map(|s| (s.0.clone(), s.1, false)).collect();
    legend(&mut out, &entries);
    out.push_str("</svg>\n");
    out
}
