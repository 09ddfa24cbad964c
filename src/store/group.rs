//! Grouping the (key, value) pairs of one call by key, in exactly the order
//! MXNet 1.9.1 gets from libstdc++'s `std::sort` on `(key, position)` pairs
//! compared by key only. For up to 16 pairs that is list order within a key;
//! beyond, introsort permutes equal keys, and the sum order (so the float
//! result) follows that permutation. This is our own implementation of the
//! algorithm libstdc++ documents (introsort, median-of-three pivot, heap sort
//! past the depth limit, final insertion sort with a threshold of 16).
#![forbid(unsafe_code)]

const THRESHOLD: usize = 16;

type Pair = (i32, usize);

/// Sorts like `std::sort(v.begin(), v.end(), by key)` in libstdc++.
pub fn stdsort(v: &mut [Pair]) {
    stdsort_by(v, &|a: &Pair, b: &Pair| a.0 < b.0);
}

/// Sorts like libstdc++'s `std::sort(first, last, less)`.
pub fn stdsort_by<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: &F) {
    if v.len() < 2 {
        return;
    }
    let depth = 2 * (usize::BITS - 1 - v.len().leading_zeros()) as usize;
    introsort_loop(v, 0, v.len(), depth, less);
    final_insertion_sort(v, 0, v.len(), less);
}

fn introsort_loop<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    mut last: usize,
    mut depth: usize,
    less: &F,
) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

fn partition_pivot<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &F,
) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    unguarded_partition(v, first + 1, last, first, less)
}

fn move_median_to_first<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    result: usize,
    a: usize,
    b: usize,
    c: usize,
    less: &F,
) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn unguarded_partition<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    less: &F,
) -> usize {
    loop {
        while less(&v[first], &v[pivot]) {
            first += 1;
        }
        last -= 1;
        while less(&v[pivot], &v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &F,
) {
    if last - first > THRESHOLD {
        insertion_sort(v, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, first, last, less);
    }
}

fn insertion_sort<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    first: usize,
    last: usize,
    less: &F,
) {
    for i in first + 1..last {
        if less(&v[i], &v[first]) {
            let val = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = val;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

fn unguarded_linear_insert<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], mut last: usize, less: &F) {
    let val = v[last];
    while less(&val, &v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = val;
}

/// libstdc++'s `partial_sort(first, last, last)`: make_heap then sort_heap.
fn heap_sort<T: Copy, F: Fn(&T, &T) -> bool>(v: &mut [T], less: &F) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        let value = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, value, less);
    }
}

fn adjust_heap<T: Copy, F: Fn(&T, &T) -> bool>(
    v: &mut [T],
    mut hole: usize,
    len: usize,
    value: T,
    less: &F,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // push_heap
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(&v[parent], &value) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = value;
}

/// Groups positions by key: `(key, positions in sum order)`, keys ascending.
pub fn group(keys: &[i32]) -> Vec<(i32, Vec<usize>)> {
    if let [k] = keys {
        return vec![(*k, vec![0])];
    }
    let mut pairs: Vec<Pair> = keys.iter().copied().zip(0..).collect();
    stdsort(&mut pairs);
    let mut out: Vec<(i32, Vec<usize>)> = Vec::new();
    for (k, pos) in pairs {
        match out.last_mut() {
            Some((last, v)) if *last == k => v.push(pos),
            _ => out.push((k, vec![pos])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn sorts_keys_for_every_length() {
        let mut seed = 7;
        for n in 0..300 {
            for range in [1u64, 3, 50, 1000] {
                let keys: Vec<i32> = (0..n).map(|_| (lcg(&mut seed) % range) as i32).collect();
                let mut pairs: Vec<Pair> = keys.iter().copied().zip(0..).collect();
                stdsort(&mut pairs);
                assert!(pairs.windows(2).all(|w| w[0].0 <= w[1].0));
                let mut pos: Vec<usize> = pairs.iter().map(|p| p.1).collect();
                pos.sort();
                assert_eq!(pos, (0..n).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn short_lists_keep_list_order() {
        let g = group(&[3, 5, 3, 1, 3]);
        assert_eq!(g, vec![(1, vec![3]), (3, vec![0, 2, 4]), (5, vec![1])]);
    }

    #[test]
    fn twenty_equal_keys_are_permuted_like_libstdcxx() {
        // One key pushed 20 times: introsort moves the median (position 10)
        // to the front and partitions; the permutation is fixed.
        let g = group(&[0; 20]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].1.len(), 20);
        assert_ne!(g[0].1, (0..20).collect::<Vec<_>>());
        assert_eq!(g[0].1[0], 10);
    }

    #[test]
    fn heap_sort_sorts() {
        let mut seed = 3;
        for n in 0..100 {
            let mut v: Vec<Pair> = (0..n).map(|i| ((lcg(&mut seed) % 10) as i32, i)).collect();
            heap_sort(&mut v, &|a: &Pair, b: &Pair| a.0 < b.0);
            assert!(v.windows(2).all(|w| w[0].0 <= w[1].0));
        }
    }
}
