//! Parameter shapes of real models, for the fusion benchmark: the gradients a data-parallel
//! step all-reduces, in the order the model defines them (backward produces them in reverse).

/// Element counts of GPT-2 small's 148 parameter tensors (124,439,808 in all), as in Hugging
/// Face's GPT2Model: token and position embeddings, 12 blocks of 12 tensors, the final norm.
pub fn gpt2_small() -> Vec<usize> {
    let d = 768;
    let mut v = vec![50257 * d, 1024 * d];
    for _ in 0..12 {
        v.extend([d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]);
    }
    v.extend([d, d]);
    v
}

/// Element counts of ResNet-50's 161 parameter tensors (25,557,032 in all), as in
/// torchvision: the stem, 16 bottleneck blocks (the first of each stage with a projection),
/// and the classifier. Batch-norm running statistics are buffers, not gradients.
pub fn resnet50() -> Vec<usize> {
    let mut v = vec![64 * 3 * 7 * 7, 64, 64];
    let mut cin = 64;
    for (blocks, w) in [(3, 64), (4, 128), (6, 256), (3, 512)] {
        for b in 0..blocks {
            v.extend([w * cin, w, w, w * w * 9, w, w, 4 * w * w, 4 * w, 4 * w]);
            if b == 0 {
                v.extend([4 * w * cin, 4 * w, 4 * w]);
            }
            cin = 4 * w;
        }
    }
    v.extend([1000 * 2048, 1000]);
    v
}

/// The model named `name`, with its display name.
pub fn by_name(name: &str) -> Option<(&'static str, Vec<usize>)> {
    match name.to_ascii_lowercase().as_str() {
        "gpt2" | "gpt2-small" => Some(("GPT-2 small", gpt2_small())),
        "resnet50" | "resnet-50" => Some(("ResNet-50", resnet50())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_the_published_parameter_counts() {
        let g = gpt2_small();
        assert_eq!((g.len(), g.iter().sum::<usize>()), (148, 124_439_808));
        let r = resnet50();
        assert_eq!((r.len(), r.iter().sum::<usize>()), (161, 25_557_032));
    }
}
