//! OpenTelemetry for the tests: one process-wide `tracing` subscriber that
//! exports every span (DEBUG and up) into the SDK's in-memory span
//! exporter, and meter providers that export into its in-memory metric
//! exporter, read on demand.
#![allow(dead_code, unreachable_pub)]

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock},
};

use mcp_persist_core::telemetry::Telemetry;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::{
    metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
        data::{AggregatedMetrics, MetricData},
    },
    trace::{InMemorySpanExporter, SdkTracerProvider, SpanData},
};
use serde_json::{Value, json};
use tracing_subscriber::{Layer as _, layer::SubscriberExt as _};

static SPANS: OnceLock<InMemorySpanExporter> = OnceLock::new();

/// Installs the process-wide subscriber (once, at `debug`) and returns its
/// exporter: every span that ends lands there at once.
pub fn spans() -> &'static InMemorySpanExporter {
    install("debug")
}

/// [`spans`] with the subscriber's filter `directives` (the first call of
/// the process decides).
pub fn install(directives: &str) -> &'static InMemorySpanExporter {
    SPANS.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("mcp-persist-tests");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::EnvFilter::new(directives));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        exporter
    })
}

/// Every span that ended so far, as JSON.
pub fn finished() -> Vec<Value> {
    spans()
        .get_finished_spans()
        .expect("finished spans")
        .iter()
        .map(span_json)
        .collect()
}

/// A span as JSON: name, trace, span and parent ids, kind, attributes and
/// the attributes of its events.
pub fn span_json(span: &SpanData) -> Value {
    let attributes: BTreeMap<String, String> = span
        .attributes
        .iter()
        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
        .collect();
    let events: Vec<BTreeMap<String, String>> = span
        .events
        .iter()
        .map(|event| {
            let mut fields: BTreeMap<String, String> = event
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect();
            fields.insert("name".into(), event.name.to_string());
            fields
        })
        .collect();
    json!({
        "name": span.name,
        "trace": span.span_context.trace_id().to_string(),
        "span": span.span_context.span_id().to_string(),
        "parent": span.parent_span_id.to_string(),
        "kind": format!("{:?}", span.span_kind),
        "attributes": attributes,
        "events": events,
    })
}

/// The spans of `trace` named `name`.
pub fn named<'a>(spans: &'a [Value], trace: &str, name: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["trace"] == trace && s["name"] == name)
        .collect()
}

/// A meter provider whose metrics are read on demand.
pub struct Meters {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

/// One data point: its attributes, and its value (a sum's value, or a
/// histogram's count).
#[derive(Debug, Clone)]
pub struct Point {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub value: f64,
}

impl Meters {
    pub fn new() -> Arc<Meters> {
        let exporter = InMemoryMetricExporter::default();
        let reader = PeriodicReader::builder(exporter.clone()).build();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        Arc::new(Meters { provider, exporter })
    }

    /// Where the crates record: this provider.
    pub fn telemetry(&self) -> Telemetry {
        Telemetry::with_meter_provider(&self.provider)
    }

    /// Every point recorded so far (cumulative).
    pub fn read(&self) -> Vec<Point> {
        self.provider.force_flush().expect("flush");
        let exported = self.exporter.get_finished_metrics().expect("metrics");
        self.exporter.reset();
        let Some(last) = exported.last() else {
            return Vec::new();
        };
        let mut points = Vec::new();
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                let name = metric.name().to_owned();
                let mut push = |attributes: BTreeMap<String, String>, value: f64| {
                    points.push(Point {
                        name: name.clone(),
                        attributes,
                        value,
                    })
                };
                let attrs = |it: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                    it.map(|kv| (kv.key.to_string(), kv.value.to_string()))
                        .collect::<BTreeMap<_, _>>()
                };
                match metric.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            push(attrs(&mut p.attributes()), p.count() as f64);
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Sum(s)) => {
                        for p in s.data_points() {
                            push(attrs(&mut p.attributes()), p.value() as f64);
                        }
                    }
                    AggregatedMetrics::I64(MetricData::Sum(s)) => {
                        for p in s.data_points() {
                            push(attrs(&mut p.attributes()), p.value() as f64);
                        }
                    }
                    other => panic!("{name}: unexpected metric data {other:?}"),
                }
            }
        }
        points
    }

    /// The sum over the points of `name` whose attributes include `with`.
    pub fn total(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        total(&self.read(), name, with)
    }
}

/// The sum over the points of `name` whose attributes include `with`.
pub fn total(points: &[Point], name: &str, with: &[(&str, &str)]) -> f64 {
    points
        .iter()
        .filter(|p| p.name == name)
        .filter(|p| {
            with.iter()
                .all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|p| p.value)
        .sum()
}

/// A random W3C `traceparent` for a client of the tests' own: its trace id,
/// and the header value.
pub fn root_traceparent() -> (String, String) {
    let mut bytes = [0u8; 24];
    getrandom_fill(&mut bytes);
    let hex = mcp_persist_core::kit::hex;
    let trace = hex(&bytes[..16]);
    let span = hex(&bytes[16..]);
    let value = format!("00-{trace}-{span}-01");
    (trace, value)
}

fn getrandom_fill(bytes: &mut [u8]) {
    use std::hash::{BuildHasher, Hasher};
    for chunk in bytes.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let v = h.finish().to_be_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}
