//! Axis, broadcast and small-value arithmetic the operators share.

use super::{MAX_VALUE_ELEMS, T};

/// Negative axes count from the end.
pub(super) fn axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

pub(super) fn broadcast(shapes: &[&[i64]]) -> Option<Vec<i64>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    (0..rank)
        .map(|i| {
            let mut d = 1;
            for s in shapes {
                let Some(k) = (i + s.len()).checked_sub(rank) else { continue };
                match (d, s[k]) {
                    (_, 1) => {}
                    (1, x) => d = x,
                    (a, b) if a == b => {}
                    _ => return None,
                }
            }
            Some(d)
        })
        .collect()
}

/// Elementwise on values (scalars broadcast), for shape arithmetic.
pub(super) fn zip_vals(a: &T, b: &T, f: impl Fn(i64, i64) -> Option<i64>) -> Option<Vec<i64>> {
    let (x, y) = (a.val.as_ref()?, b.val.as_ref()?);
    let n = x.len().max(y.len());
    if !(x.len() == n || x.len() == 1) || !(y.len() == n || y.len() == 1) {
        return None;
    }
    (0..n).map(|i| f(x[if x.len() == 1 { 0 } else { i }], y[if y.len() == 1 { 0 } else { i }])).collect()
}

/// The values of a small tensor of `out` shape, each taken from `src`
/// (row-major, of `src_shape`) at the multi-index `from` gives for it.
pub(super) fn remap(
    src: &[i64],
    src_shape: &[i64],
    out: &[i64],
    from: impl Fn(&[i64]) -> Vec<i64>,
) -> Option<Vec<i64>> {
    let n = product(out)?;
    if n > MAX_VALUE_ELEMS as i64 {
        return None;
    }
    let mut idx = vec![0i64; out.len()];
    let mut vals = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let at = from(&idx);
        let mut flat = 0i64;
        for (d, &i) in src_shape.iter().zip(&at) {
            if !(0..*d).contains(&i) {
                return None;
            }
            flat = flat * d + i;
        }
        vals.push(*src.get(flat as usize)?);
        // The next multi-index, last axis fastest.
        for a in (0..out.len()).rev() {
            idx[a] += 1;
            if idx[a] < out[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Some(vals)
}

pub(super) fn product(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d))
}
