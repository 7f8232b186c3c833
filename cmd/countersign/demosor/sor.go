// Package demosor is the demo's system of record: a small HTTP service of
// customers and orders that accepts refunds and outgoing emails. It backs
// `countersign demo` and the end-to-end tests, and honours Idempotency-Key
// like a careful payment API would: a repeated key returns the first result
// and changes nothing.
package demosor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Customer is a customer record.
type Customer struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Email string `json:"email"`
	Tier  string `json:"tier"`
}

// Order is an order record.
type Order struct {
	ID         string   `json:"id"`
	CustomerID string   `json:"customer_id"`
	Customer   Customer `json:"customer"`
	Items      []string `json:"items"`
	Total      float64  `json:"total"`
	Shipping   float64  `json:"shipping"`
	Status     string   `json:"status"`
	Refunded   float64  `json:"refunded"`
}

// Refund is a refund that was issued.
type Refund struct {
	ID             string  `json:"id"`
	OrderID        string  `json:"order_id"`
	Amount         float64 `json:"amount"`
	Reason         string  `json:"reason"`
	IdempotencyKey string  `json:"idempotency_key"`
}

// Email is an email that was sent.
type Email struct {
	ID             string `json:"id"`
	To             string `json:"to"`
	Subject        string `json:"subject"`
	Body           string `json:"body"`
	IdempotencyKey string `json:"idempotency_key"`
}

// Priority is a change of an order's fulfilment priority.
type Priority struct {
	OrderID        string `json:"order_id"`
	Priority       string `json:"priority"`
	IdempotencyKey string `json:"idempotency_key"`
}

// Service is the in-memory system of record. The zero value is not usable;
// call New.
type Service struct {
	mu        sync.Mutex // guards everything below
	customers map[string]Customer
	orders    map[string]*Order
	refunds   []Refund
	emails    []Email
	priority  []Priority
	deleted   []string
	byKey     map[string][]byte // idempotency key → first response body
	hits      map[string]int    // "METHOD /path" → count
}

// New returns a service seeded with a few customers and orders, including
// order 1234 (an oak table that arrived damaged; shipping $64.00).
func New() *Service {
	s := &Service{
		customers: map[string]Customer{},
		orders:    map[string]*Order{},
		byKey:     map[string][]byte{},
		hits:      map[string]int{},
	}
	for _, c := range []Customer{
		{ID: "C-100", Name: "Dana Whitfield", Email: "dana@example.com", Tier: "gold"},
		{ID: "C-200", Name: "Lee Park", Email: "lee.park@example.com", Tier: "standard"},
		{ID: "C-300", Name: "Ana Souza", Email: "ana@example.org", Tier: "standard"},
	} {
		s.customers[c.ID] = c
	}
	for _, o := range []Order{
		{ID: "1234", CustomerID: "C-100", Items: []string{"Oak dining table"}, Total: 1289.00, Shipping: 64.00, Status: "delivered"},
		{ID: "5678", CustomerID: "C-200", Items: []string{"Standing desk"}, Total: 649.00, Shipping: 49.00, Status: "delivered"},
		{ID: "9012", CustomerID: "C-300", Items: []string{"Notebook", "Fountain pen"}, Total: 39.90, Shipping: 4.50, Status: "in_transit"},
	} {
		o := o
		o.Customer = s.customers[o.CustomerID]
		s.orders[o.ID] = &o
	}
	return s
}

// Handler serves the API:
//
//	GET    /orders/{id}      order with its customer
//	GET    /customers/{id}   customer
//	GET    /customers?email= customer by email
//	DELETE /customers/{id}   delete a customer (idempotent)
//	POST   /refunds          {order_id, amount, reason}
//	POST   /emails           {to, subject, body}
//	POST   /orders/{id}/priority {priority}
//	GET    /refunds, /emails what was done (for people and tests)
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders/{id}", s.getOrder)
	mux.HandleFunc("GET /customers/{id}", s.getCustomer)
	mux.HandleFunc("GET /customers", s.findCustomer)
	mux.HandleFunc("DELETE /customers/{id}", s.deleteCustomer)
	mux.HandleFunc("POST /refunds", s.postRefund)
	mux.HandleFunc("POST /emails", s.postEmail)
	mux.HandleFunc("POST /orders/{id}/priority", s.postPriority)
	mux.HandleFunc("GET /refunds", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, http.StatusOK, s.refunds)
	})
	mux.HandleFunc("GET /emails", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		writeJSON(w, http.StatusOK, s.emails)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hits[r.Method+" "+r.URL.Path]++
		s.mu.Unlock()
		mux.ServeHTTP(w, r)
	})
}

// Hits reports how many times "METHOD /path" was requested.
func (s *Service) Hits(methodPath string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[methodPath]
}

// Refunds returns the refunds issued so far.
func (s *Service) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Refund(nil), s.refunds...)
}

// Emails returns the emails sent so far.
func (s *Service) Emails() []Email {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Email(nil), s.emails...)
}

// Deleted returns the ids of deleted customers.
func (s *Service) Deleted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]string(nil), s.deleted...)
	sort.Strings(out)
	return out
}

func (s *Service) getOrder(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.orders[r.PathValue("id")]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "order not found"})
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Service) getCustomer(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.customers[r.PathValue("id")]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "customer not found"})
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Service) findCustomer(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	email := strings.ToLower(r.URL.Query().Get("email"))
	for _, c := range s.customers {
		if strings.ToLower(c.Email) == email {
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"error": "no customer with email " + email})
}

func (s *Service) deleteCustomer(w http.ResponseWriter, r *http.Request) {
	s.idempotent(w, r, func() (int, any) {
		id := r.PathValue("id")
		if _, ok := s.customers[id]; !ok {
			return http.StatusNotFound, map[string]string{"error": "customer not found"}
		}
		delete(s.customers, id)
		s.deleted = append(s.deleted, id)
		return http.StatusOK, map[string]string{"deleted": id}
	})
}

func (s *Service) postRefund(w http.ResponseWriter, r *http.Request) {
	var in struct {
		OrderID string  `json:"order_id"`
		Amount  float64 `json:"amount"`
		Reason  string  `json:"reason"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid JSON: " + err.Error()})
		return
	}
	s.idempotent(w, r, func() (int, any) {
		o, ok := s.orders[in.OrderID]
		if !ok {
			return http.StatusNotFound, map[string]string{"error": "order not found"}
		}
		if in.Amount <= 0 || in.Amount > o.Total-o.Refunded {
			return http.StatusUnprocessableEntity, map[string]string{"error": fmt.Sprintf("amount %.2f exceeds refundable %.2f", in.Amount, o.Total-o.Refunded)}
		}
		o.Refunded += in.Amount
		rf := Refund{ID: fmt.Sprintf("RF-%d", len(s.refunds)+1), OrderID: o.ID, Amount: in.Amount, Reason: in.Reason, IdempotencyKey: r.Header.Get("Idempotency-Key")}
		s.refunds = append(s.refunds, rf)
		return http.StatusCreated, rf
	})
}

func (s *Service) postEmail(w http.ResponseWriter, r *http.Request) {
	var in struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		Body    string `json:"body"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid JSON: " + err.Error()})
		return
	}
	s.idempotent(w, r, func() (int, any) {
		if !strings.Contains(in.To, "@") {
			return http.StatusUnprocessableEntity, map[string]string{"error": "invalid recipient"}
		}
		e := Email{ID: fmt.Sprintf("EM-%d", len(s.emails)+1), To: in.To, Subject: in.Subject, Body: in.Body, IdempotencyKey: r.Header.Get("Idempotency-Key")}
		s.emails = append(s.emails, e)
		return http.StatusCreated, e
	})
}

func (s *Service) postPriority(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Priority string `json:"priority"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid JSON: " + err.Error()})
		return
	}
	id := r.PathValue("id")
	s.idempotent(w, r, func() (int, any) {
		if _, ok := s.orders[id]; !ok {
			return http.StatusNotFound, map[string]string{"error": "no order " + id}
		}
		p := Priority{OrderID: id, Priority: in.Priority, IdempotencyKey: r.Header.Get("Idempotency-Key")}
		s.priority = append(s.priority, p)
		return http.StatusOK, p
	})
}

// Priorities returns the priority changes made, oldest first.
func (s *Service) Priorities() []Priority {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Priority(nil), s.priority...)
}

// idempotent runs do once per Idempotency-Key (under the lock) and replays
// the first response for repeats.
func (s *Service) idempotent(w http.ResponseWriter, r *http.Request, do func() (int, any)) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if key != "" {
		if body, ok := s.byKey[key]; ok {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body)
			return
		}
	}
	status, v := do()
	body, _ := json.Marshal(v)
	if key != "" && status < 300 {
		s.byKey[key] = body
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
