//! Latency-versus-size plots as SVG.
//!
//! Owns: turning [`Record`]s (measured by `tpar bench` or predicted by `tpar sim`) into a
//! log-log chart, one line per (algorithm, backend, world). Writes only the file it is given.
//! Uses plotters' SVG backend without its font features: text is emitted as SVG `<text>`
//! elements and laid out with plotters' built-in size estimate, so no fontconfig or
//! freetype is needed at build or run time.

use crate::error::{Error, Result};
use crate::report::Record;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Chart size in pixels.
const SIZE: (u32, u32) = (960, 600);

/// Line colours, cycled (colour-blind-safe Okabe-Ito palette plus black).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(150, 150, 150),
];

/// One line of a chart: a name and its (bytes, us) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Human size for axis labels: 256 B, 4 KiB, 1 MiB (the crate's one byte formatter).
pub fn fmt_bytes(b: f64) -> String {
    crate::units::human_bytes(b.max(0.0).round() as u64)
}

/// An axis number: no decimals when whole, else one.
fn trim(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0}", v)
    } else {
        format!("{:.1}", v)
    }
}

fn draw_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        rank: 0,
        context: format!("writing plot {}", path.display()),
        source: std::io::Error::other(e.to_string()),
    }
}

/// Latency versus size of `records`, one line per (algorithm, backend, world), to `path`.
/// This is what `tpar bench --svg` and `tpar sim --svg` call.
pub fn latency_svg(records: &[Record], path: &Path) -> Result<()> {
    let worlds: std::collections::BTreeSet<usize> = records.iter().map(|r| r.world).collect();
    let backends: std::collections::BTreeSet<&str> = records.iter().map(|r| r.backend.as_str()).collect();
    let mut groups: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in records {
        let mut name = r.algorithm.name().to_string();
        if backends.len() > 1 {
            name.push_str(&format!(" [{}]", r.backend));
        }
        if worlds.len() > 1 {
            name.push_str(&format!(" x{}", r.world));
        }
        groups.entry(name).or_default().push((r.bytes as f64, r.time_us));
    }
    let series: Vec<Series> = groups.into_iter().map(|(name, points)| Series { name, points }).collect();
    let world = match worlds.iter().next() {
        Some(w) if worlds.len() == 1 => format!(", {w} ranks"),
        _ => String::new(),
    };
    let backend = backends.into_iter().collect::<Vec<_>>().join("/");
    series_svg(&format!("all-reduce latency ({backend}{world})"), &series, path)
}

/// A log-log latency chart of arbitrary series.
pub fn series_svg(title: &str, series: &[Series], path: &Path) -> Result<()> {
    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    if pts().next().is_none() {
        return Err(Error::invalid("records", "nothing to plot"));
    }
    if pts().any(|(b, t)| !(b > 0.0 && t > 0.0 && b.is_finite() && t.is_finite())) {
        return Err(Error::invalid("records", "a log-log plot needs positive sizes and times"));
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, 0.0f64, f64::INFINITY, 0.0f64);
    for (b, t) in pts() {
        x0 = x0.min(b);
        x1 = x1.max(b);
        y0 = y0.min(t);
        y1 = y1.max(t);
    }
    // x is drawn as log2(bytes) so ticks land on powers of two (4 KiB, not 9.8 KiB).
    // Pad a little so end points and single-size data stay inside the frame.
    let (x0, x1, y0, y1) = (x0.log2() - 0.3, x1.log2() + 0.3, y0 / 1.3, y1 * 1.3);
    let x_ticks = (x1 - x0).ceil().max(1.0) as usize + 1;

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("time per all-reduce (us)")
        .x_labels(x_ticks)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                fmt_bytes(x.round().exp2())
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 14))
        .y_label_formatter(&|y| trim(*y))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut p: Vec<(f64, f64)> = s.points.iter().map(|&(b, t)| (b.log2(), t)).collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(p.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| draw_err(path, e))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart
            .draw_series(p.iter().map(|&xy| Circle::new(xy, 3, colour.filled())))
            .map_err(|e| draw_err(path, e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::Algorithm;
use crate::dtype::DType;

    #[test]
    fn writes_an_svg_with_text_and_one_line_per_algorithm() {
        let dir = std::env::temp_dir().join(format!("tpar-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lat.svg");
        let mut recs = Vec::new();
        for a in [Algorithm::Nccl, Algorithm::OneshotPush] {
            for (i, b) in [4096usize, 65536, 1 << 20].iter().enumerate() {
                let t = 10.0 + i as f64 * 20.0 + if a == Algorithm::Nccl { 10.0 } else { 0.0 };
                let (algbw, busbw) = crate::report::bandwidths(*b, 4, t);
                recs.push(Record {
                    algorithm: a,
                    collective: Default::default(),
                    backend: "sim".into(),
                    dtype: DType::BF16,
                    world: 4,
                    bytes: *b,
                    count: b / 2,
                    time_us: t,
                    p10_us: t,
                    p90_us: t,
                    algbw,
                    busbw,
                    wrong: -1,
                });
            }
        }
        latency_svg(&recs, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("<text") && svg.contains("oneshot-push") && svg.contains("nccl"));
        assert!(svg.contains("64 KiB") || svg.contains("16 KiB"), "power-of-two ticks");
        std::fs::remove_dir_all(&dir).ok();
        assert!(latency_svg(&[], &path).is_err());
    }

    #[test]
    fn byte_labels() {
        assert_eq!(fmt_bytes(256.0), "256 B");
        assert_eq!(fmt_bytes(43008.0), "42 KiB");
        assert_eq!(fmt_bytes(1536.0), "1.5 KiB");
        assert_eq!(fmt_bytes(1048576.0), "1 MiB");
    }
}
