//! Adding a section to a report already written: its markdown at the end of `report.md`, its
//! details and figures as keys of `report.json`, replacing what an earlier run of the same
//! section wrote, and the rest of both files kept byte for byte.

use serde_json::Value;
use std::path::Path;

/// `report` (a pretty-printed JSON object) with `key: value` as its last entry, replacing an
/// earlier one written the same way (and keeping any other key appended after it). The rest
/// of the text is kept as it is, so the report's numbers are not reprinted.
pub fn with_last_key(report: &str, key: &str, value: &Value) -> Result<String, String> {
    let marker = format!(",\n  \"{key}\": ");
    let kept = match report.find(&marker) {
        Some(at) => {
            let rest = &report[at + marker.len()..];
            // The next top-level key (two spaces of indent), or the object's end.
            let tail = rest.find(",\n  \"").map_or("\n}\n", |i| &rest[i..]);
            format!("{}{tail}", &report[..at])
        }
        None => report.to_string(),
    };
    let body = kept
        .trim_end()
        .strip_suffix('}')
        .ok_or("report.json is not a JSON object")?
        .trim_end();
    let value = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    let out = format!("{body}{marker}{}\n}}\n", value.replace('\n', "\n  "));
    serde_json::from_str::<Value>(&out).map_err(|e| format!("report.json would not parse: {e}"))?;
    Ok(out)
}

/// Adds a section to the report in `out`: `markdown` (starting with `heading`) at the end of
/// `report.md` and `key: value` in `report.json`, replacing what an earlier run wrote.
pub fn add_section(
    out: &Path,
    heading: &str,
    markdown: &str,
    key: &str,
    value: &Value,
) -> Result<(), Box<dyn std::error::Error>> {
    let md_path = out.join("report.md");
    let mut md = std::fs::read_to_string(&md_path)?;
    if let Some(start) = md.find(&format!("\n{heading}")) {
        let rest = &md[start + 1..];
        let end = rest[heading.len()..]
            .find("\n## ")
            .map_or(md.len(), |i| start + 1 + heading.len() + i);
        md.replace_range(start..end, "");
    }
    md += markdown;
    std::fs::write(&md_path, md)?;
    let json_path = out.join("report.json");
    let text = std::fs::read_to_string(&json_path)?;
    std::fs::write(&json_path, with_last_key(&text, key, value)?)?;
    Ok(())
}

/// Puts `figures` (an object of headline keys) into the report in `out` as top-level keys
/// of `report.json`, and renders its figures table in `report.md` again from `table`, in
/// place: for a section measured on its own after the report's run.
pub fn add_figures(
    out: &Path,
    figures: &Value,
    table: &[crate::figures::Figure],
) -> Result<(), Box<dyn std::error::Error>> {
    let json_path = out.join("report.json");
    let mut text = std::fs::read_to_string(&json_path)?;
    for (key, value) in figures.as_object().ok_or("figures are an object")? {
        text = with_last_key(&text, key, value)?;
    }
    std::fs::write(&json_path, &text)?;
    let report: Value = serde_json::from_str(&text)?;
    let md_path = out.join("report.md");
    let md = std::fs::read_to_string(&md_path)?;
    let start = md
        .find("| figure | key |")
        .ok_or("report.md has no figures table")?;
    let end = md[start..].find("\n\n").map_or(md.len(), |i| start + i + 1);
    let mut new = md.clone();
    new.replace_range(start..end, &crate::figures::targets_table(table, &report));
    std::fs::write(&md_path, new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn appended_keys_replace_themselves_and_keep_the_rest_verbatim() {
        let report = "{\n  \"a\": 0.30000000000000004,\n  \"b\": [\n    1\n  ]\n}\n";
        let once = with_last_key(report, "k", &json!({"x": 1})).unwrap();
        assert!(once.starts_with("{\n  \"a\": 0.30000000000000004,\n  \"b\": [\n    1\n  ],"));
        let other = with_last_key(&once, "w", &json!({"y": [1, 2]})).unwrap();
        let twice = with_last_key(&other, "k", &json!({"x": 2})).unwrap();
        let v: Value = serde_json::from_str(&twice).unwrap();
        assert_eq!(v["k"]["x"], 2);
        assert_eq!(v["w"]["y"][1], 2);
        assert_eq!(v["a"], json!(0.30000000000000004));
        assert_eq!(twice.matches("\"k\"").count(), 1);
        assert!(twice.starts_with("{\n  \"a\": 0.30000000000000004,"));
        assert!(with_last_key("[1]", "k", &Value::Null).is_err());
    }
}
