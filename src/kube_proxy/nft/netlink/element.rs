//! One element of a set or map as the kernel takes it, written in libnftnl's attribute order.

use super::attr::Writer;
use super::consts::*;
use super::expr::write_verdict;

/// One element of a set or map: `NFTA_LIST_ELEM`-like entry of `NFTA_SET_ELEM_LIST_ELEMENTS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub key: Vec<u8>,
    pub interval_end: bool,
    pub value: Option<ElementValue>,
    pub udata: Option<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementValue {
    Verdict { code: i32, chain: Option<String> },
    Data(Vec<u8>),
}

impl Element {
    /// The element's attributes in libnftnl's order, inside the entry numbered `index`
    /// (libnftnl numbers a list's entries from 1 rather than tagging them LIST_ELEM).
    pub fn write(&self, w: &mut Writer, index: u16) {
        let entry = w.nest(index);
        if self.interval_end {
            w.put_be32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
        }
        w.put_data_value(NFTA_SET_ELEM_KEY, &self.key);
        match &self.value {
            Some(ElementValue::Verdict { code, chain }) => {
                let data = w.nest(NFTA_SET_ELEM_DATA);
                write_verdict(w, *code, chain.as_deref());
                w.end_nest(data);
            }
            Some(ElementValue::Data(bytes)) => w.put_data_value(NFTA_SET_ELEM_DATA, bytes),
            None => {}
        }
        if let Some(udata) = &self.udata {
            w.put(NFTA_SET_ELEM_USERDATA, udata);
        }
        w.end_nest(entry);
    }
}
