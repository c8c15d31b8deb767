//! bench.svg: bandwidth and latency against message size, per test and transport mode.

use std::path::Path;

use anyhow::Result;

use super::stats::q;
use super::{Bench, Mode};

pub(super) fn plot(b: &Bench, modes: &[Mode], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let s = &b.samples;
    let p = &b.profile;
    let root = SVGBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let colour = |test: &str| match test {
        "write" => RGBColor(31, 119, 180),
        "read" => RGBColor(44, 160, 44),
        "send" => RGBColor(255, 127, 14),
        _ => RGBColor(0, 0, 0),
    };
    // Series: (label, mode, points, colour, dashed).
    type Series = (String, Mode, Vec<(f64, f64)>, RGBColor, bool);
    let series = |kind: &str, tests: &[&str], field: &str, sizes: &[u64]| -> Vec<Series> {
        let mut v = Vec::new();
        for &mode in modes {
            for &test in tests {
                let pts: Vec<(f64, f64)> = sizes
                    .iter()
                    .filter_map(|&size| {
                        let st = s.stat(q("data", mode, test, kind, size, 0), field)?;
                        (st.median > 0.0).then_some((size as f64, st.median))
                    })
                    .collect();
                if !pts.is_empty() {
                    let label = if test.starts_with("tcp-") {
                        format!("{test} baseline ({} mode's namespaces)", mode.name())
                    } else if kind == "lat" && test == "read" {
                        format!("read, full RTT ({})", mode.name())
                    } else {
                        format!("{test} ({})", mode.name())
                    };
                    let mut c = colour(test);
                    if test.starts_with("tcp-") && mode == Mode::Xdp {
                        c = RGBColor(140, 140, 140);
                    }
                    v.push((label, mode, pts, c, mode == Mode::Xdp));
                }
            }
        }
        v
    };
    let draw = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                title: &str,
                ylabel: &str,
                legend: SeriesLabelPosition,
                data: Vec<Series>|
     -> Result<()> {
        let ys: Vec<f64> = data.iter().flat_map(|d| d.2.iter().map(|p| p.1)).collect();
        let (ymin, ymax) = if ys.is_empty() {
            (0.1, 10.0)
        } else {
            (
                ys.iter().copied().fold(f64::MAX, f64::min) / 1.5,
                ys.iter().copied().fold(0.0, f64::max) * 1.5,
            )
        };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((48f64..6e6f64).log_scale(), (ymin..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("message size, bytes")
            .y_desc(ylabel)
            .x_label_formatter(&|x| {
                let x = x.round();
                if x >= 1e6 {
                    format!("{} MB", x / 1e6)
                } else if x >= 1e3 {
                    format!("{} kB", x / 1e3)
                } else {
                    format!("{x} B")
                }
            })
            .draw()?;
        for (label, _mode, pts, c, dashed) in data {
            let style = ShapeStyle::from(&c).stroke_width(2);
            if dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
                    .label(label)
                    .legend(move |(x, y)| {
                        plotters::element::DashedPathElement::new(
                            vec![(x, y), (x + 18, y)],
                            4,
                            3,
                            ShapeStyle::from(&c).stroke_width(2),
                        )
                    });
            } else {
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], ShapeStyle::from(&c).stroke_width(2))
                    });
            }
            chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    };
    draw(
        &left,
        "Bandwidth (median of runs)",
        "Gb/s",
        SeriesLabelPosition::LowerRight,
        series(
            "bw",
            &["tcp-stream", "write", "read", "send"],
            "bw_gbps",
            &p.bw_sizes,
        ),
    )?;
    draw(
        &right,
        "Latency p50 (send/write/TCP: half RTT; read: RTT)",
        "µs",
        SeriesLabelPosition::UpperLeft,
        series(
            "lat",
            &["tcp-pingpong", "send", "write", "read"],
            "lat_p50_us",
            &p.lat_sizes,
        ),
    )?;
    root.present()?;
    Ok(())
}
