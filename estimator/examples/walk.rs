fn main() {
    let p = std::env::args().nth(1).unwrap();
    let b = carma_estimator::read_bounded_bytes(std::path::Path::new(&p)).unwrap();
    let g = carma_estimator::onnx::parse(&b, &p).unwrap();
    let mut kinds = std::collections::BTreeMap::<String, (u32, u64)>::new();
    for l in &g.net.layers {
        let e = kinds.entry(l.kind.clone()).or_default();
        e.0 += 1;
        e.1 += l.out_elems;
    }
    println!("{p}: params {:?} fixed_batch {:?} transformer {:?} {:?}", g.net.total_params, g.fixed_batch, g.transformer, kinds);
    let prof = carma_estimator::features::profile(&g.net);
    println!("retained/sample {:.1} MiB", prof.retained_per_sample * 4.0 / 1048576.0);
}
