//! A small SVG chart of a load test: admitted and limited requests per second, with the
//! admitted count the policy's arithmetic expects.

use std::fmt::Write;

use crate::loadtest::LoadReport;

/// Renders the per-second series of `report` as a standalone SVG document.
pub fn svg(report: &LoadReport) -> String {
    let (w, h, left, bottom, top, right) = (760.0, 360.0, 50.0, 40.0, 30.0, 170.0);
    let n = report.per_second.len().max(1);
    let max = report
        .per_second
        .iter()
        .map(|&(a, l, p)| (a + l).max(p))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let x = |i: f64| left + plot_w * i / n as f64;
    let y = |v: f64| top + plot_h * (1.0 - v / max);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{left}" y="18">{} requests at {:.1}/s: {} admitted, {} limited{}</text>"#,
        report.requests,
        report.rate_per_s,
        report.admitted,
        report.limited,
        report
            .predicted_admitted
            .map(|p| format!(", {p} predicted"))
            .unwrap_or_default()
    );
    // Axes and grid.
    for k in 0..=4 {
        let v = max * k as f64 / 4.0;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##,
            left + plot_w
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"#,
            left - 6.0,
            yy + 4.0
        );
    }
    let step = (n / 10).max(1);
    for i in (0..=n).step_by(step) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{i}s</text>"#,
            x(i as f64),
            h - bottom + 16.0
        );
    }
    // Stacked bars: admitted (green) below limited (red).
    let bw = plot_w / n as f64 * 0.8;
    for (i, &(a, l, _)) in report.per_second.iter().enumerate() {
        let x0 = x(i as f64) + plot_w / n as f64 * 0.1;
        let ya = y(a as f64);
        let _ = write!(
            s,
            r##"<rect x="{x0:.1}" y="{ya:.1}" width="{bw:.1}" height="{:.1}" fill="#2e7d32"/>"##,
            y(0.0) - ya
        );
        let yl = y((a + l) as f64);
        let _ = write!(
            s,
            r##"<rect x="{x0:.1}" y="{yl:.1}" width="{bw:.1}" height="{:.1}" fill="#c62828"/>"##,
            ya - yl
        );
    }
    // Expected admitted per second.
    if report.predicted_admitted.is_some() {
        let pts: Vec<String> = report
            .per_second
            .iter()
            .enumerate()
            .map(|(i, &(_, _, p))| format!("{:.1},{:.1}", x(i as f64 + 0.5), y(p as f64)))
            .collect();
        let _ = write!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#1565c0" stroke-width="2"/>"##,
            pts.join(" ")
        );
    }
    let lx = w - right + 10.0;
    for (i, (color, label)) in [
        ("#2e7d32", "admitted"),
        ("#c62828", "limited (429)"),
        ("#1565c0", "expected admitted"),
    ]
    .iter()
    .enumerate()
    {
        let ly = top + 20.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{lx}" y="{ly}" width="12" height="12" fill="{color}"/>"#
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}">{label}</text>"#,
            lx + 18.0,
            ly + 10.0
        );
    }
    s.push_str("</svg>\n");
    s
}
