//! Minimal SVG line charts (no dependencies): one chart per GPU, one line
//! per policy, like the paper's utilization and memory figures.

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

/// `series`: (label, points (x, y)). Axes: x from 0 to the largest x, y from 0 to `y_max`.
pub fn line_chart(title: &str, y_label: &str, y_max: f64, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 260.0, 60.0, 40.0, 30.0, 150.0);
    let x_max = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(1.0, f64::max);
    let px = |x: f64| left + (x / x_max) * (w - left - right);
    let py = |y: f64| h - bottom - (y / y_max).clamp(0.0, 1.0) * (h - bottom - top);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left}\" y=\"18\" font-size=\"13\">{}</text>\n",
        escape(title)
    );
    s.push_str(&format!(
        "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"black\"/>\n",
        h - bottom,
        w - right
    ));
    for i in 0..=4 {
        let y = y_max * f64::from(i) / 4.0;
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            left - 5.0,
            py(y) + 4.0,
            fmt_num(y)
        ));
        let x = x_max * f64::from(i) / 4.0;
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.1} h</text>\n",
            px(x),
            h - bottom + 15.0,
            x / 3600.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"12\" y=\"{:.1}\" transform=\"rotate(-90 12 {:.1})\" text-anchor=\"middle\">{}</text>\n",
        (h - bottom + top) / 2.0,
        (h - bottom + top) / 2.0,
        escape(y_label)
    ));
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
        s.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.2\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        let ly = top + 14.0 * i as f64;
        s.push_str(&format!(
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{2}\" y=\"{3}\">{4}</text>\n",
            w - right + 10.0,
            w - right + 30.0,
            w - right + 35.0,
            ly + 4.0,
            escape(label)
        ));
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
