//! `--svg`: bus bandwidth against size, one labelled line per
//! (collective, type, op) (out of place); with `--nccl`, NCCL's busbw on
//! the same buffers as a dashed line of the same colour. Sizes read as
//! `64 KiB`, bandwidths without trailing zeros.

use std::path::Path;

use plotters::prelude::*;

use super::Row;

pub fn plot(path: &Path, rows: &[Row], nranks: u32) -> anyhow::Result<()> {
    let max_bw = rows
        .iter()
        .flat_map(|r| [Some(r.busbw_gbps), r.nccl.nccl_busbw_gbps])
        .flatten()
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let min_b = rows.iter().map(|r| r.bytes).min().unwrap_or(1).max(1) as f64;
    let max_b = rows.iter().map(|r| r.bytes).max().unwrap_or(2).max(2) as f64;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("oxccl busbw, {nranks} ranks"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((min_b..max_b * 1.01).log_scale(), 0.0..max_bw * 1.1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|v| crate::topo::human(v.round() as usize))
        .y_label_formatter(&|v| {
            format!("{v:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        })
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // One series per (collective, type, op): rows of several types or ops
    // drawn as one line would zig-zag between them.
    let mut series: Vec<(&str, &str, &str)> = Vec::new();
    for r in rows {
        let key = (r.coll.as_str(), r.dtype.as_str(), r.op.as_str());
        if !series.contains(&key) {
            series.push(key);
        }
    }
    let label = |(c, d, o): (&str, &str, &str)| {
        if series.len() == 1 || series.iter().all(|s| s.1 == d && s.2 == o) {
            c.to_string()
        } else {
            format!("{c} {d} {o}")
        }
    };
    for (i, &key) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mine =
            |r: &&Row| (r.coll.as_str(), r.dtype.as_str(), r.op.as_str()) == key && !r.in_place;
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(mine)
            .map(|r| (r.bytes as f64, r.busbw_gbps))
            .collect();
        let name = label(key);
        chart
            .draw_series(LineSeries::new(pts, color))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        let nccl: Vec<(f64, f64)> = rows
            .iter()
            .filter(mine)
            .filter_map(|r| Some((r.bytes as f64, r.nccl.nccl_busbw_gbps?)))
            .collect();
        if !nccl.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(nccl, 6, 4, color.into()))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(format!("{name} (NCCL)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y)], color));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
