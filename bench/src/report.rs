//! The results document: machine facts, then one section per scenario, each with its tables.
//! Rendered as markdown with padded columns, so the same text reads well on a terminal and
//! in `bench/results/latest.md`.

use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug)]
pub struct Table {
    pub caption: Option<String>,
    header: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            caption: None,
            header: columns.iter().map(|(h, a)| (h.to_string(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    pub fn caption(mut self, text: impl Into<String>) -> Table {
        self.caption = Some(text.into());
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.header.len(),
            "row width differs from the header"
        );
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.header[c].0.chars().count(), 3])
                    .max()
                    .unwrap_or(3)
            })
            .collect();
        let line = |cells: &mut dyn Iterator<Item = (String, Align, usize)>| {
            let parts: Vec<String> = cells
                .map(|(text, align, w)| match align {
                    Align::Left => format!("{text:<w$}"),
                    Align::Right => format!("{text:>w$}"),
                })
                .collect();
            format!("| {} |\n", parts.join(" | "))
        };
        let mut out = String::new();
        if let Some(c) = &self.caption {
            let _ = writeln!(out, "{c}\n");
        }
        out += &line(
            &mut self
                .header
                .iter()
                .zip(&widths)
                .map(|((h, a), w)| (h.clone(), *a, *w)),
        );
        let rule: Vec<String> = self
            .header
            .iter()
            .zip(&widths)
            .map(|((_, a), w)| match a {
                Align::Left => format!(":{}", "-".repeat(w - 1)),
                Align::Right => format!("{}:", "-".repeat(w - 1)),
            })
            .collect();
        let _ = writeln!(out, "| {} |", rule.join(" | "));
        for r in &self.rows {
            out += &line(
                &mut r
                    .iter()
                    .zip(&self.header)
                    .zip(&widths)
                    .map(|((t, (_, a)), w)| (t.clone(), *a, *w)),
            );
        }
        out
    }
}

/// One scenario's part of the document.
#[derive(Clone, Debug, Default)]
pub struct Section {
    pub title: String,
    /// Paragraphs before the tables (what is measured, how).
    pub intro: Vec<String>,
    pub tables: Vec<Table>,
    /// Paragraphs after the tables (findings, warnings).
    pub notes: Vec<String>,
}

impl Section {
    pub fn render(&self) -> String {
        let mut out = format!("## {}\n\n", self.title);
        for p in &self.intro {
            let _ = writeln!(out, "{p}\n");
        }
        for t in &self.tables {
            let _ = writeln!(out, "{}", t.render());
        }
        for p in &self.notes {
            let _ = writeln!(out, "{p}\n");
        }
        out
    }
}

pub struct Report {
    pub title: String,
    pub facts: Vec<(String, String)>,
    pub sections: Vec<Section>,
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = format!("# {}\n\n", self.title);
        for (k, v) in &self.facts {
            let _ = writeln!(out, "- {k}: {v}");
        }
        out.push('\n');
        for s in &self.sections {
            out += &s.render();
        }
        out
    }
}

/// `12345.6` -> `12 346`: readable throughput.
pub fn thousands(x: f64) -> String {
    if !x.is_finite() {
        return "-".to_string();
    }
    let digits = format!("{:.0}", x.round());
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_and_align() {
        let mut t = Table::new(&[("name", Align::Left), ("n", Align::Right)]);
        t.row(vec!["a".into(), "10".into()]);
        assert_eq!(
            t.render(),
            "| name |   n |\n| :--- | --: |\n| a    |  10 |\n"
        );
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(1234567.4), "1 234 567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(f64::NAN), "-");
    }
}
