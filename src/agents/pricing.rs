//! What a Bedrock model call costs: [`BEDROCK_PRICES`], a table of on-demand prices per model, as
//! data. A model that is not in it (nor added with
//! [`BedrockProvider::with_price`](crate::BedrockProvider::with_price)) has its usage reported
//! and no cost.
//!
//! The prices are AWS's on-demand prices in US dollars per million tokens for `us-east-1`, as
//! published on <https://aws.amazon.com/bedrock/pricing/> (checked 2025-12). What they cannot
//! cover: another region's price, the premium some geographic cross-region inference profiles
//! (`us.`, `eu.`, `apac.`…) carry for some models, batch, provisioned throughput or
//! priority tiers, and a price AWS changed since: add or override a row with
//! [`BedrockProvider::with_price`](crate::BedrockProvider::with_price).

use ironflow_core::error::PartialUsage;
use ironflow_core::pricing::{CostBreakdown, ModelPricing, PricingSource};

/// One row of [`BEDROCK_PRICES`]: a model and its rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelPrice {
    /// The foundation model id without its version suffix's variants: a model id or an
    /// inference profile id starting with it (after its geographic prefix) is priced by this row.
    pub model: &'static str,
    /// The rates, in US dollars per million tokens.
    pub rates: ModelPricing,
}

/// A row: input, output, cache read, cache write, in US dollars per million tokens.
const fn row(model: &'static str, input: f64, output: f64, read: f64, write: f64) -> ModelPrice {
    ModelPrice {
        model,
        rates: ModelPricing {
            input_per_1m: input,
            output_per_1m: output,
            cache_read_per_1m: read,
            cache_write_per_1m: write,
        },
    }
}

/// On-demand prices of Bedrock models, US dollars per million tokens (input, output, prompt
/// cache read, prompt cache write), `us-east-1` (see the module docs for what they do not cover).
pub static BEDROCK_PRICES: &[ModelPrice] = &[
    row(
        "anthropic.claude-opus-4-5-20251101-v1",
        5.0,
        25.0,
        0.5,
        6.25,
    ),
    row(
        "anthropic.claude-opus-4-1-20250805-v1",
        15.0,
        75.0,
        1.5,
        18.75,
    ),
    row(
        "anthropic.claude-opus-4-20250514-v1",
        15.0,
        75.0,
        1.5,
        18.75,
    ),
    row(
        "anthropic.claude-sonnet-4-5-20250929-v1",
        3.0,
        15.0,
        0.3,
        3.75,
    ),
    row(
        "anthropic.claude-sonnet-4-20250514-v1",
        3.0,
        15.0,
        0.3,
        3.75,
    ),
    row(
        "anthropic.claude-3-7-sonnet-20250219-v1",
        3.0,
        15.0,
        0.3,
        3.75,
    ),
    row(
        "anthropic.claude-haiku-4-5-20251001-v1",
        1.0,
        5.0,
        0.1,
        1.25,
    ),
    row(
        "anthropic.claude-3-5-haiku-20241022-v1",
        0.8,
        4.0,
        0.08,
        1.0,
    ),
    row("amazon.nova-premier-v1", 2.5, 12.5, 0.625, 2.5),
    row("amazon.nova-pro-v1", 0.8, 3.2, 0.2, 0.8),
    row("amazon.nova-lite-v1", 0.06, 0.24, 0.015, 0.06),
    row("amazon.nova-micro-v1", 0.035, 0.14, 0.00875, 0.035),
    row("meta.llama3-3-70b-instruct-v1", 0.72, 0.72, 0.72, 0.72),
    row("mistral.mistral-large-2407-v1", 2.0, 6.0, 2.0, 2.0),
    row("deepseek.r1-v1", 1.35, 5.4, 1.35, 1.35),
    row("openai.gpt-oss-120b-1", 0.15, 0.6, 0.15, 0.15),
    row("openai.gpt-oss-20b-1", 0.07, 0.3, 0.07, 0.07),
];

/// The geographic prefixes of Bedrock's cross-region inference profile ids.
const PROFILE_PREFIXES: &[&str] = &[
    "global.", "us-gov.", "us.", "eu.", "apac.", "jp.", "au.", "ca.",
];

/// The foundation model behind `model`: an inference profile's or a model's ARN reduced to its
/// id (what follows the last `/`), then a geographic prefix (`us.`, `global.`…) removed.
///
/// ```text
/// arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0 → amazon.nova-pro-v1:0
/// global.anthropic.claude-sonnet-4-5-20250929-v1:0 → anthropic.claude-sonnet-4-5-20250929-v1:0
/// ```
pub(crate) fn foundation_model(model: &str) -> &str {
    let id = model.rsplit('/').next().unwrap_or(model);
    PROFILE_PREFIXES
        .iter()
        .find_map(|p| id.strip_prefix(p))
        .unwrap_or(id)
}

/// The rates of `model`: the longest row of `extra` (the provider's own, first) or of
/// [`BEDROCK_PRICES`] its foundation model starts with.
pub(crate) fn rates_of(model: &str, extra: &[(String, ModelPricing)]) -> Option<ModelPricing> {
    let id = foundation_model(model);
    let longest = |rows: &mut dyn Iterator<Item = (&str, ModelPricing)>| {
        rows.filter(|(m, _)| id.starts_with(m))
            .max_by_key(|(m, _)| m.len())
            .map(|(_, r)| r)
    };
    longest(&mut extra.iter().map(|(m, r)| (foundation_model(m), *r)))
        .or_else(|| longest(&mut BEDROCK_PRICES.iter().map(|p| (p.model, p.rates))))
}

/// Tokens of one or more model calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Usage {
    /// The tokens `partial` reports (zero where it reports none).
    pub fn of(partial: &PartialUsage) -> Self {
        Self {
            input: partial.input_tokens.unwrap_or(0),
            output: partial.output_tokens.unwrap_or(0),
            cache_read: partial.cache_read_input_tokens.unwrap_or(0),
            cache_write: partial.cache_creation_input_tokens.unwrap_or(0),
        }
    }

    /// This usage plus `other`'s (saturating).
    pub fn add(&mut self, other: Usage) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
    }
}

/// The cost of `usage` on `model` in US dollars, `None` when the model has no price.
pub(crate) fn cost(model: &str, usage: Usage, extra: &[(String, ModelPricing)]) -> Option<f64> {
    /// ironflow's cost arithmetic over the one row found (its fallback price never applies).
    struct Found(ModelPricing);
    impl PricingSource for Found {
        fn price_per_1m(&self, _model: &str) -> Option<(f64, f64)> {
            Some((self.0.input_per_1m, self.0.output_per_1m))
        }
        fn model_pricing(&self, _model: &str) -> Option<ModelPricing> {
            Some(self.0)
        }
    }
    let rates = rates_of(model, extra)?;
    let breakdown = CostBreakdown::compute_with_cache(
        &Found(rates),
        model,
        usage.input,
        usage.cache_read,
        usage.cache_write,
        usage.output,
    );
    Some(breakdown.total_usd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_arns_are_priced_as_their_foundation_model() {
        for id in [
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ] {
            let usage = Usage {
                input: 1_000_000,
                output: 1_000_000,
                cache_read: 1_000_000,
                cache_write: 0,
            };
            assert_eq!(cost(id, usage, &[]), Some(3.0 + 15.0 + 0.3), "{id}");
        }
        assert_eq!(cost("acme.unknown-v1:0", Usage::default(), &[]), None);
        let own = [(
            "acme.unknown-v1".to_string(),
            ModelPricing::without_cache(1.0, 2.0),
        )];
        let usage = Usage {
            input: 500_000,
            output: 250_000,
            ..Usage::default()
        };
        assert_eq!(cost("us.acme.unknown-v1:0", usage, &own), Some(1.0));
    }

    #[test]
    fn the_longest_row_wins() {
        // "anthropic.claude-opus-4-20250514-v1" must not price opus 4.5 or 4.1.
        let opus45 = rates_of("anthropic.claude-opus-4-5-20251101-v1:0", &[]);
        assert_eq!(opus45.map(|r| r.input_per_1m), Some(5.0));
    }
}
