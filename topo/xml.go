package topo

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Element is one element of an NCCL topology document (`<system>`, `<cpu>`,
// `<pci>`, `<gpu>`, `<nvlink>`, `<nic>`, `<net>`, ...). Documents are kept as
// element trees with their attributes in file order, so that a file read and
// written again keeps every attribute, including ones gccl does not interpret.
type Element struct {
	Name     string
	Attrs    []Attr
	Children []*Element
}

// Attr is one attribute of an Element.
type Attr struct {
	Name, Value string
}

// Limits on documents read from outside, so that a hostile or corrupt file
// gives an error instead of exhausting memory or the stack.
const (
	maxDocumentBytes = 16 << 20
	maxDepth         = 64
	maxElements      = 1 << 16
	maxAttrs         = 64 // per element; NCCL's parser allows 16
)

// Get returns the value of attribute name and whether it is present.
func (e *Element) Get(name string) (string, bool) {
	for _, a := range e.Attrs {
		if a.Name == name {
			return a.Value, true
		}
	}
	return "", false
}

// Attr returns the value of attribute name, or "" when absent.
func (e *Element) Attr(name string) string {
	v, _ := e.Get(name)
	return v
}

// Set sets attribute name, keeping its position when it exists.
func (e *Element) Set(name, value string) {
	for i := range e.Attrs {
		if e.Attrs[i].Name == name {
			e.Attrs[i].Value = value
			return
		}
	}
	e.Attrs = append(e.Attrs, Attr{name, value})
}

// Add appends a child element and returns it.
func (e *Element) Add(name string, attrs ...Attr) *Element {
	c := &Element{Name: name, Attrs: attrs}
	e.Children = append(e.Children, c)
	return c
}

// Child returns the first child called name, or nil.
func (e *Element) Child(name string) *Element {
	for _, c := range e.Children {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Clone returns a deep copy of e.
func (e *Element) Clone() *Element {
	c := &Element{Name: e.Name, Attrs: append([]Attr(nil), e.Attrs...)}
	for _, ch := range e.Children {
		c.Children = append(c.Children, ch.Clone())
	}
	return c
}

// ParseXML reads an NCCL topology document (NCCL_TOPO_FILE format). The root
// must be `<system>`. Text between elements is ignored, as NCCL ignores it.
func ParseXML(r io.Reader) (*Element, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("topo: reading topology XML: %w", err)
	}
	if len(data) > maxDocumentBytes {
		return nil, fmt.Errorf("topo: topology XML larger than %d bytes", maxDocumentBytes)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	var root *Element
	var stack []*Element
	elements := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("topo: parsing topology XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			elements++
			if elements > maxElements {
				return nil, fmt.Errorf("topo: topology XML has more than %d elements", maxElements)
			}
			if len(stack) >= maxDepth {
				return nil, fmt.Errorf("topo: topology XML nested deeper than %d", maxDepth)
			}
			if t.Name.Space != "" {
				return nil, fmt.Errorf("topo: unexpected namespaced element <%s:%s>", t.Name.Space, t.Name.Local)
			}
			if len(t.Attr) > maxAttrs {
				return nil, fmt.Errorf("topo: <%s> has more than %d attributes", truncate(t.Name.Local), maxAttrs)
			}
			e := &Element{Name: t.Name.Local}
			for _, a := range t.Attr {
				if a.Name.Space != "" {
					return nil, fmt.Errorf("topo: unexpected namespaced attribute %s:%s on <%s>", a.Name.Space, a.Name.Local, e.Name)
				}
				if _, dup := e.Get(a.Name.Local); dup {
					return nil, fmt.Errorf("topo: duplicate attribute %q on <%s>", a.Name.Local, e.Name)
				}
				e.Attrs = append(e.Attrs, Attr{a.Name.Local, a.Value})
			}
			if len(stack) == 0 {
				if root != nil {
					return nil, errors.New("topo: topology XML has more than one root element")
				}
				root = e
			} else {
				p := stack[len(stack)-1]
				p.Children = append(p.Children, e)
			}
			stack = append(stack, e)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) == 0 && len(bytes.TrimSpace(t)) > 0 {
				return nil, errors.New("topo: text outside the root element")
			}
		}
	}
	if root == nil {
		return nil, errors.New("topo: topology XML is empty")
	}
	if root.Name != "system" {
		return nil, fmt.Errorf("topo: root element is <%s>, want <system>", root.Name)
	}
	return root, nil
}

// WriteXML writes root in NCCL's layout: two spaces of indentation per level,
// one element per line, attributes in their stored order, empty elements
// closed with "/>".
func WriteXML(w io.Writer, root *Element) error {
	var b strings.Builder
	writeElement(&b, root, 0)
	_, err := io.WriteString(w, b.String())
	return err
}

// MarshalXML returns root as NCCL-format bytes.
func MarshalXML(root *Element) []byte {
	var b strings.Builder
	writeElement(&b, root, 0)
	return []byte(b.String())
}

func writeElement(b *strings.Builder, e *Element, depth int) {
	b.WriteString(strings.Repeat("  ", depth))
	b.WriteByte('<')
	b.WriteString(e.Name)
	for _, a := range e.Attrs {
		b.WriteByte(' ')
		b.WriteString(a.Name)
		b.WriteString(`="`)
		xmlEscape(b, a.Value)
		b.WriteByte('"')
	}
	if len(e.Children) == 0 {
		b.WriteString("/>\n")
		return
	}
	b.WriteString(">\n")
	for _, c := range e.Children {
		writeElement(b, c, depth+1)
	}
	b.WriteString(strings.Repeat("  ", depth))
	b.WriteString("</")
	b.WriteString(e.Name)
	b.WriteString(">\n")
}

func xmlEscape(b *strings.Builder, s string) {
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		case '\n':
			b.WriteString("&#xA;")
		case '\r':
			b.WriteString("&#xD;")
		case '\t':
			b.WriteString("&#x9;")
		default:
			b.WriteRune(r)
		}
	}
}
